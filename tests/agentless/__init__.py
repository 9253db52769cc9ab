"""Agentless mode: Event Grid source, ARM approver, their simulator stand-ins."""
