"""Jupyter Notebook 6's sign-in for a compute-catalog workspace (NotebookApp.login_handler_class).

The only token is the platform's, in TOKEN_FILE (written by `workspace-secret jupyter`), read on every request: when
the platform changes it (the requester's rotation), the notebook takes the new one at once, without a restart that
would stop the running kernels. A browser signs in with `?token=`, the `Authorization: token` header or the login
page; its login cookie holds a fingerprint of the token it was earned with and stops working with that token. Before
the platform has written a token, nothing opens the notebook.
"""

import hashlib
import hmac
import uuid

from notebook.auth.login import LoginHandler

TOKEN_FILE = "/run/workspace/jupyter-token"


def current_token() -> str:
    try:
        with open(TOKEN_FILE) as held:
            return held.read().strip()
    except OSError:
        return ""


def _fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def _matches(given: str, token: str) -> bool:
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


class WorkspaceLogin(LoginHandler):
    def post(self):
        """The login page: the token typed in."""
        token = current_token()
        if not _matches(self.get_argument("password", default=""), token):
            self.set_status(401)
            self._render(message={"error": "Invalid credentials"})
            return
        self.set_login_cookie(self, f"{uuid.uuid4().hex}:{_fingerprint(token)}")
        self._redirect_safe(self.get_argument("next", default=self.base_url))

    @classmethod
    def get_user(cls, handler):
        if getattr(handler, "_user_id", None):
            return handler._user_id
        token = current_token()
        user_id = None
        if _matches(cls.get_token(handler), token):
            user_id = cls.set_login_cookie(handler, f"{uuid.uuid4().hex}:{_fingerprint(token)}")
            handler._token_authenticated = True
        elif token:
            cookie = handler.get_secure_cookie(
                handler.cookie_name, **handler.settings.get("get_secure_cookie_kwargs", {})
            )
            signed_in = cookie.decode(errors="replace") if cookie else ""
            if signed_in.endswith(f":{_fingerprint(token)}"):
                user_id = signed_in
        if user_id is None and handler.get_cookie(handler.cookie_name) is not None:
            handler.clear_login_cookie()  # earned with an old token, or not ours
        handler._user_id = user_id
        return user_id

    @classmethod
    def get_login_available(cls, settings):
        return True  # never "no authentication": without a token nothing signs in
