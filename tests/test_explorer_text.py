"""What the explorer page says about a model, without a browser: service/serve/ui/app.js run by
node with a stub document (its top level only declares functions and waits for DOMContentLoaded).
Skipped where node is missing; tests/test_explorer.py drives the page in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from service.model.bundle import load_bundle
from service.serve.protocol import model_description
from tests.conftest import REPO

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")
APP = REPO / "service" / "serve" / "ui" / "app.js"


def page_call(function: str, *args: Any) -> Any:
    """app.js's `function(...args)`, its result as JSON."""
    script = (
        "const vm = require('vm'); const fs = require('fs');"
        "const context = { document: { addEventListener() {} }, console };"
        f"vm.createContext(context); vm.runInContext(fs.readFileSync({json.dumps(str(APP))}, 'utf8'),"
        " context);"
        f"context.args = {json.dumps(list(args))};"
        f"console.log(JSON.stringify(vm.runInContext('{function}(...args)', context)));"
    )
    assert NODE is not None
    done = subprocess.run([NODE, "-e", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def info_of(model: str) -> dict[str, Any]:
    """The ModelInfo fields the page reads, as the server fills them for an embedded model."""
    bundle = load_bundle(REPO / "models" / model)
    threshold = bundle.confidence_threshold or 0.0
    return {"description": model_description(bundle.info), "confidence_threshold": threshold}


@pytest.mark.parametrize("model", ["grc-en-nt", "g2p", "default"])
def test_the_domain_line_promises_flags_only_where_the_model_has_a_threshold(model: str) -> None:
    """The Greek model has no threshold: its domain line must not say out-of-domain answers are
    flagged (the line below it says no answer is); the numbers model's threshold does flag them."""
    info = info_of(model)
    domain = page_call("domainText", info)
    threshold = page_call("thresholdText", info)
    assert info["description"] in domain
    flags = info["confidence_threshold"] > 0
    assert ("flagged low confidence" in domain) == flags, domain
    assert ("no answer is flagged" in threshold) == (not flags), threshold
    if not flags:
        assert "not flagged" in domain


def test_a_model_without_a_description_says_so() -> None:
    text = page_call("domainText", {"description": "", "confidence_threshold": 0.5})
    assert text == "This model does not describe its domain."
