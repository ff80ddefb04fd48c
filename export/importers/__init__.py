"""Importers: other toolkits' RNN checkpoints → this project's bundle (see docs/import.md)."""
