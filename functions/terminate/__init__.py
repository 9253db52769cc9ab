"""The drain workflow: drain (HTTP hook, relay hook), then approve, before `NotBefore`, for
every event a policy rule drains (Terminate, Reboot, Redeploy, Preempt, Freeze), and the
undrain when the VM is back. `workflow` orders the steps and resumes them from
`functions.store.drains` after a restart; `steps` performs one step each; `settings` are
the `DRAIN__*` and `UNDRAIN__*` app settings."""
