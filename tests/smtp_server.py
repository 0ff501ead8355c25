"""A real SMTP server on the loopback (aiosmtpd) that keeps what it receives, for tests of the mails we send."""

import email
import email.policy
import socket
import threading
import time
from contextlib import contextmanager
from email.message import EmailMessage

from aiosmtpd.controller import Controller


class Mailbox:
    """What arrived, parsed: `messages` in arrival order, each an EmailMessage with its envelope recipients."""

    def __init__(self):
        self.messages: list[EmailMessage] = []
        self._arrived = threading.Condition()

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        with self._arrived:
            self.messages.append(message)
            self._arrived.notify_all()
        return "250 Message accepted for delivery"

    def wait_for(self, count: int, timeout: float = 10.0) -> list[EmailMessage]:
        """Wait until at least `count` messages arrived; all of them."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"expected {count} mails, {len(self.messages)} arrived: {self.subjects()}")
                self._arrived.wait(left)
            return list(self.messages)

    def to(self, address: str) -> list[EmailMessage]:
        return [message for message in self.messages if address in message["X-Envelope-To"]]

    def subjects(self) -> list[str]:
        return [message["Subject"] for message in self.messages]

    def clear(self) -> None:
        with self._arrived:
            self.messages.clear()


def text_of(message: EmailMessage) -> str:
    return message.get_body(preferencelist=("plain",)).get_content()


def html_of(message: EmailMessage) -> str:
    return message.get_body(preferencelist=("html",)).get_content()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def smtp_server():
    """Yield (host, port, mailbox) while a real SMTP server listens on the loopback."""
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        yield controller.hostname, controller.port, mailbox
    finally:
        controller.stop()
