"""The central brain: fleet-wide event lifecycle, approval policy, approval through the relay."""
