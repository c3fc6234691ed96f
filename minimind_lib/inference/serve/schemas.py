"""The request bodies the server accepts (pydantic models): chat messages with text and
picture parts, tool calls and tool results, ``/v1/chat/completions`` (with ``tools`` and the
thinking switches) and ``/generate``. A field of the wrong type or text
that is not valid Unicode is a 400 naming the field.
"""


from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from minimind_lib.tokenizer.bpe import text_problem

# --------------------------------------------------------------------------- request bodies


def _valid_text(text: str) -> str:
    """``text``, if it has UTF-8 bytes (a JSON ``"\\ud800"`` escape gives a str that has not)."""
    problem = text_problem(text)
    if problem:
        raise PydanticCustomError("invalid_text", problem)
    return text


class Strict(BaseModel):
    """Types as OpenAI's API checks them: ``true`` is no temperature, ``"2"`` no token count,
    ``"yes"`` no boolean (an int is still a float)."""

    model_config = ConfigDict(strict=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    url: str
    detail: str | None = None


class ImagePart(Strict):
    """OpenAI's picture part; only ``data:`` URLs are read
    (``vision.pictures.image_from_data_url``)."""

    type: Literal["image_url"]
    image_url: ImageURL


class FunctionCall(Strict):
    name: str = Field(min_length=1, max_length=64)
    arguments: str  # JSON, as OpenAI sends it back

    _valid_arguments = field_validator("arguments")(_valid_text)


class ToolCall(Strict):
    """A call an assistant message made (sent back by the client with the results)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this is the result of
    reasoning_content: str | None = None  # assistant: its thinking, as this server returns it
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _valid_content(cls, content: str | list | None) -> str | list | None:
        texts = [] if content is None else [content] if isinstance(content, str) else \
            [p.text for p in content if isinstance(p, TextPart)]
        for text in texts:
            _valid_text(text)
        return content

    _valid_reasoning = field_validator("reasoning_content")(
        lambda text: text if text is None else _valid_text(text))

    @model_validator(mode="after")
    def _content_or_calls(self) -> "Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("missing_content", "content is required (it may be null "
                                      "only in an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("misplaced_calls", "only an assistant message has "
                                      "tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content if isinstance(p, TextPart))

    def image_urls(self) -> list[str]:
        return [] if not isinstance(self.content, list) else \
            [p.image_url.url for p in self.content if isinstance(p, ImagePart)]

    def as_dict(self) -> dict:
        """ChatML's message; OpenAI's ``developer`` role (newer clients' name) is the system;
        an assistant's calls and thinking kept for the template."""
        out = {"role": "system" if self.role == "developer" else self.role,
               "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"name": c.function.name, "arguments": c.function.arguments}
                                 for c in self.tool_calls]
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out


class FunctionSpec(Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # structured outputs: calls always follow ``parameters``


class ToolSpec(Strict):
    """One of the request's ``tools``: an OpenAI function schema."""

    type: Literal["function"]
    function: FunctionSpec

    def schema(self) -> dict:
        """As the prompt shows it (``strict`` is for the decoder, not the model)."""
        return {"type": "function",
                "function": self.function.model_dump(exclude_none=True, exclude={"strict"})}


class TemplateKwargs(Strict):
    """``chat_template_kwargs``: the chat template's switches (vLLM's and SGLang's field)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    enable_thinking: bool | None = None
    open_thinking: bool | None = None  # MiniMind-3's name for the same switch


class StreamOptions(Strict):
    include_usage: bool = False


class ChatRequest(Strict):
    """OpenAI's chat completion request (the fields this server uses; others are ignored).
    Sampling fields are only typed here: ``SamplingParams`` checks their values."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    tools: list[ToolSpec] | None = Field(None, max_length=64)
    tool_choice: object = None  # auto | none | required | {"type": "function", ...}
    parallel_tool_calls: bool | None = None
    response_format: object = None  # text | json_object | json_schema (structured_outputs)
    chat_template_kwargs: TemplateKwargs | None = None
    open_thinking: bool | None = None  # MiniMind's own server reads this one
    # the legacy function-calling fields and sampling features this server does not have:
    # read only to be refused by name when set, not ignored in silence
    functions: list | None = None
    function_call: object = None
    logprobs: object = None
    top_logprobs: object = None
    logit_bias: object = None
    presence_penalty: object = None
    frequency_penalty: object = None
    audio: object = None
    modalities: object = None
    prediction: object = None

    def unsupported(self) -> str | None:
        """The first field set that this server cannot honour (None: all can be)."""
        inactive = {"logprobs": [False],
                    "logit_bias": [{}], "presence_penalty": [0, 0.0],
                    "frequency_penalty": [0, 0.0], "modalities": [["text"]]}
        for name in ("functions", "function_call", *inactive, "top_logprobs", "audio",
                     "prediction"):
            value = getattr(self, name)
            if value is not None and value not in inactive.get(name, []):
                return name
        return None

    def thinking(self) -> bool:
        """Whether the prompt opens the think block (either switch, either place)."""
        kwargs = self.chat_template_kwargs
        given = [self.open_thinking] + ([kwargs.enable_thinking, kwargs.open_thinking]
                                        if kwargs else [])
        return any(given)


class GenerateRequest(Strict):
    """``POST /generate``: one prompt, its text back."""

    model_config = ConfigDict(strict=True, extra="forbid")
    prompt: str = Field(min_length=1)
    max_new_tokens: int | None = None
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    chat: bool = True  # wrap the prompt as one user turn in ChatML (for SFT/DPO models)

    _valid_prompt = field_validator("prompt")(_valid_text)


class ToolRunRequest(Strict):
    """``POST /v1/tools/run``: one call of a course tool (the chat page's tool loop)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    arguments: str | dict = Field(default_factory=dict)
