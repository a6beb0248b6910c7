"""Benchmarks behind `orchestrator bench ...`: they print figures; nothing here is a test."""
