"""The documentation's code examples, executed."""
