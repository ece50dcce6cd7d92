"""The exchange protocol and the statistics' invariants: messages and their checks, the Runtime
interface they cross, the checked exchange, load checks."""
