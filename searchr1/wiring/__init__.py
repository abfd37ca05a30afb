"""The services a command runs with, brought up together (services): the tokenizer, the PyTRIO
connection or the offline twin, the search backend, the shipped index and the offline world."""
