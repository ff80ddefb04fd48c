"""Benchmarks of alignment and markup: Align's speed with a link head, Translate with markup."""
