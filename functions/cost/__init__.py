"""What a deployment costs a month and how many VMs it can take: `python -m functions cost`.

Not part of the data path: an operator tool beside it. `prices.json` is the dated list
price table (with the platform limits), `counts.json` the per-operation counts `make
bench` measured last, `model.py` the arithmetic, `report.py` the printed table.
"""
