"""What every stage agrees on, with no I/O: the wire formats and the pure decision.

`envelope` is the IMDS document and the relay's envelope (the relay writes it with the
standard library; tests hold both to this model). `event` is the transition that is
announced to channels. `policy` is the operators' rules and the pure `decide()`.
"""
