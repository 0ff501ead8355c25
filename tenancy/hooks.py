"""Hooks higher apps register in their ready(), so tenancy can show their data without importing them (the registry
is config/hooks.py)."""

from typing import Protocol

from config.hooks import Hook


class ProjectUsage(Protocol):
    """requests: current quota usage of the given projects, {project_id: {dimension: value}}."""

    def __call__(self, project_ids: list[int], /) -> dict[int, dict]: ...


PROJECT_USAGE = Hook("project_usage", ProjectUsage, provider="requests")


class OpenWork(Protocol):
    """requests: the person's open requests in the project, [{id, title, state, url}] (url a path)."""

    def __call__(self, project_id: int, user_id: int, /) -> list[dict]: ...


OPEN_WORK = Hook("open_work", OpenWork, provider="requests")
