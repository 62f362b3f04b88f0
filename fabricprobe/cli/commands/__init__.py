"""One module per `probe` command (or command group)."""
