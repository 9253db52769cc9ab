"""Table storage: the fleet's state between messages.

`records` are the rows (VMs, events, capacity slots), `tables` reads and writes them with
ETags so concurrent invocations agree, `keys` turns names into keys one-to-one, `drains`
keeps the terminate workflow's step rows, `deliveries` what each channel posted (or
refused for good) per announcement. Nothing above this package talks to Azure
Tables directly.
"""
