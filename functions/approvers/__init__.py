"""The ways an approval reaches Azure. `relay`: the relay's signed `/v1/start` callback,
which POSTs `StartRequests` to IMDS from inside the VM. The workflow that chooses and
retries lives in `functions.pipeline.approve`."""
