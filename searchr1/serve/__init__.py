"""``serve``: the trained agent behind an OpenAI-compatible ``/v1/chat/completions``.

:mod:`~searchr1.serve.chat_api` reads requests and writes answers in OpenAI's shapes (pure);
:mod:`~searchr1.serve.model` runs a turn or the whole agent on a sampler;
:mod:`~searchr1.serve.app` is the bounded HTTP server around them.
"""
