"""One module per tool: each wires its kernel programs to its views and sinks."""
