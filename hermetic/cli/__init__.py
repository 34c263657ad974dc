"""The command line: ``parser`` (the grammar), ``commands`` (one function per command, and the table that
dispatches to them), ``main`` (the entry point, where every error becomes its exit code)."""
