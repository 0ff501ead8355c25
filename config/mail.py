"""Mails the platform sends: plain text and HTML from one pair of templates, links under PUBLIC_BASE_URL.

Django's mail framework sends them: the console backend in the demo, SMTP when EMAIL_HOST is set (settings.py).
Callers are django-q2 tasks, never a request's transaction.
"""

from dataclasses import dataclass, field

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.template.loader import render_to_string


def absolute_url(path: str) -> str:
    """`path` (e.g. from reverse()) as a link people can follow from a mail."""
    return settings.PUBLIC_BASE_URL.rstrip("/") + path


@dataclass
class Mail:
    """One message to one address: `template` names `<template>.txt` and `<template>.html`, which both get
    `context` plus `subject`, `recipient` and `base_url`."""

    to: str
    subject: str
    template: str
    context: dict = field(default_factory=dict)

    def message(self, connection=None) -> EmailMultiAlternatives:
        context = {
            **self.context,
            "subject": self.subject,
            "recipient": self.to,
            "base_url": settings.PUBLIC_BASE_URL.rstrip("/"),
        }
        text = render_to_string(f"{self.template}.txt", context)
        html = render_to_string(f"{self.template}.html", context)
        subject = " ".join(self.subject.split())  # one line, whatever the data held
        message = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, [self.to], connection=connection)
        message.attach_alternative(html, "text/html")
        return message


def mails_send(mails: list[Mail]) -> int:
    """Send every mail over one connection; how many were sent. A failure raises (the task is retried)."""
    mails = [mail for mail in mails if mail.to]
    if not mails:
        return 0
    with get_connection() as connection:
        return connection.send_messages([mail.message(connection) for mail in mails]) or 0
