"""Idle detection that warns, then acts: an offering's IdlePolicy, the signals the platform already receives
(accelerator readings, open SSH/Jupyter sessions, gateway calls), one pure decision (decide), the periodic sweep
that warns, clears and acts (services), and the owner's snooze (services, views, api)."""
