"""The scale-set terminate workflow: drain (HTTP hook, relay hook), then approve, before
`NotBefore`. `workflow` orders the steps and resumes them from `functions.store.drains`
after a restart; `steps` performs one step each."""
