"""Click commands, one module per command (registered in ``searchr1.commands.main.COMMANDS``)."""
