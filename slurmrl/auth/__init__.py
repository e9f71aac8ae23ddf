"""Authentication: MUNGE for the controller RPC, per-job HMAC secrets for the data plane.

- `munge`: `encode`/`decode` over libmunge (ctypes), `MungeError` with munge's code.
- `requests`: `sign_request(method, path, body) -> "MUNGE <cred>"` for the client,
  `verify_request(header, method, path, body) -> Identity` for the controller.
- `tokens`: `mint_secret()`, `sign(secret, ...) -> headers`, `Verifier(secret).verify(...)`.

Every refusal is an `AuthError` with a short `code` (an `AuthCode`) and a message.
"""

from slurmrl.auth.errors import AuthCode, AuthError

__all__ = ["AuthCode", "AuthError"]
