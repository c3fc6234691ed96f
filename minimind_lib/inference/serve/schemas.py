"""The request bodies the server accepts (pydantic models): chat messages with text and
picture parts, ``/v1/chat/completions`` and ``/generate``. A field of the wrong type or text
that is not valid Unicode is a 400 naming the field.
"""


from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
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


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart | ImagePart]

    @field_validator("content")
    @classmethod
    def _valid_content(cls, content: str | list) -> str | list:
        texts = [content] if isinstance(content, str) else \
            [p.text for p in content if isinstance(p, TextPart)]
        for text in texts:
            _valid_text(text)
        return content

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content if isinstance(p, TextPart))

    def image_urls(self) -> list[str]:
        return [] if isinstance(self.content, str) else \
            [p.image_url.url for p in self.content if isinstance(p, ImagePart)]

    def as_dict(self) -> dict:
        """ChatML's message; OpenAI's ``developer`` role (newer clients' name) is the system."""
        return {"role": "system" if self.role == "developer" else self.role,
                "content": self.text()}


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
    # read only to be refused by name (tool calling is not served yet), not ignored in silence
    tools: list | None = None
    tool_choice: object = None
    functions: list | None = None
    function_call: object = None


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
