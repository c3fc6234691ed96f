"""Every server error in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
``APIError`` and its kinds (400, 503), and the handlers that turn FastAPI's and Starlette's own
errors (validation, 404, 413, bad JSON) into that shape.
"""




from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

RETRY_AFTER_SECONDS = 2

# --------------------------------------------------------------------------- errors


def error_body(message: str, param: str | None = None, type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error answered with HTTP ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, *,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code, self.headers = type, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.param, self.type, self.code),
                            status_code=self.status, headers=self.headers)


class BadRequest(APIError):
    """A request that is well-formed but cannot be served (answered with HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, param)


class ServerBusy(APIError):
    """Too many requests already wait for the model (HTTP 503, retry later)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(503, f"the server is busy: {waiting} requests are waiting for the model; "
                              f"retry in {RETRY_AFTER_SECONDS} s", type="server_error",
                         code="server_busy", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class ClientGone(Exception):
    """The client hung up before its job started; nobody reads the answer."""


# --------------------------------------------------------------------------- error handlers


async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic's validation errors as one OpenAI-style 400."""
    problems, params = [], []
    for e in exc.errors():
        if e["type"] == "json_invalid":  # loc is ("body", char offset): say what it means
            error = e.get("ctx", {}).get("error", "")
            problems.append(f"the request body is not valid JSON ({error})")
            continue
        where = ".".join(str(x) for x in e["loc"] if x != "body")
        problems.append(f"{where}: {e['msg']}" if where else e["msg"])
        params.append(where or None)
    return JSONResponse(error_body("; ".join(problems), params[0] if params else None),
                        status_code=400)


async def api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def http_error(_: Request | None, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own errors (404, 405, 413, a body that is not UTF-8 JSON) in
    OpenAI's shape instead of ``{"detail": ...}``."""
    message = str(exc.detail)
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        message = f"the request body is not valid UTF-8 (byte {cause.start})"
    elif isinstance(cause, RecursionError):
        message = "the request body's JSON is nested too deeply"
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, type=kind), status_code=exc.status_code,
                        headers=exc.headers)


async def client_gone(_: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it
