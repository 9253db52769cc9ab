"""The JSON Schema of the relay envelope, generated from the function app's pydantic model.

    .venv/bin/python -m tests.relay.wire_schema      # rewrites functions/model/envelope.schema.json

The function app's model (functions/model/envelope.py) is the reference for what it
accepts; the relay (standard library only) cannot import it. The committed schema is what
both sides are checked against: tests/relay/test_wire_format.py regenerates it (so it cannot
drift from the model) and validates real relay output with it. `document` is described by
the model of an IMDS Scheduled Events document, not just "an object".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "functions" / "model" / "envelope.schema.json"


def generate() -> dict[str, Any]:
    from functions.model.envelope import Envelope, ScheduledEventsDocument

    schema = Envelope.model_json_schema(by_alias=True, mode="validation")
    document = ScheduledEventsDocument.model_json_schema(by_alias=True, mode="validation")
    defs = schema.setdefault("$defs", {})
    defs.update(document.pop("$defs", {}))
    defs["ScheduledEventsDocument"] = document
    schema["properties"]["document"]["anyOf"] = [
        {"$ref": "#/$defs/ScheduledEventsDocument"},
        {"type": "null"},
    ]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$comment"] = (
        "Generated from functions/model/envelope.py by `python -m tests.relay.wire_schema`; "
        "do not edit by hand."
    )
    return schema


def render() -> str:
    return json.dumps(generate(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    print(SCHEMA_PATH, file=sys.stderr)
