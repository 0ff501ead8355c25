"""Ansible stdout callback for the platform's in-band steps: one JSON document on stdout at the end of the run.

ansible-core ships no JSON callback (the `json` one lives in the ansible.posix collection), so this small one is
the repo's own. Document: {"stats": {host: {ok, changed, failures, unreachable, skipped, rescued, ignored}},
"tasks": [{task, host, status, changed, msg, permanent, facts}], "facts": {host: {...set_stats data...}}}.
A task tagged `permanent` fails for good (retrying cannot fix it); other failures are worth retrying. Results are
reduced to what a step's output and log need: no module arguments (no secrets) and no full stdout.
"""

import json

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: step_json
    type: stdout
    short_description: one JSON document for a provisioning step
    description: The platform's own JSON stdout callback (see the module docstring).
"""

MESSAGE_LIMIT = 600


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "step_json"

    def __init__(self):
        super().__init__()
        self.tasks = []

    def _record(self, result, status):
        outcome = result._result
        message = outcome.get("msg") or outcome.get("stderr") or outcome.get("reason") or ""
        if status == "failed" and outcome.get("rc") not in (None, 0):  # a command: what it said beats "non-zero rc"
            message = (outcome.get("stderr") or outcome.get("stdout") or message).strip()
        self.tasks.append(
            {
                "task": result._task.get_name(),
                "host": result._host.get_name(),
                "status": status,
                "changed": bool(outcome.get("changed")),
                "msg": str(message)[-MESSAGE_LIMIT:],
                "permanent": "permanent" in (result._task.tags or []),
            }
        )

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_playbook_on_stats(self, stats):
        hosts = sorted(stats.processed.keys())
        document = {
            "stats": {host: stats.summarize(host) for host in hosts},
            "tasks": self.tasks,
            "facts": dict(stats.custom),
        }
        self._display.display(json.dumps(document), screen_only=False)
