"""The chat page (GET / of minimind_lib.inference.serve,
minimind_lib/inference/serve/static/chat.html).

Always: the page is served, self-contained (nothing fetched from elsewhere) and holds the
elements the tests drive; /v1/models carries the model card it shows. In a real headless
Chromium (Debian's chromium + chromium-driver, driven by selenium): type, send and read the
same greedy answers the API gives over a three-turn conversation with a system prompt; stop
an answer mid-stream and see the server stop generating. The browser tests skip, saying so,
only where chromium cannot be found (`make browser` installs it; `make test` runs that first).
"""

import re
import shutil
import time

import httpx
import pytest
from tiny import ScriptedReplies, noisy

from minimind_lib.inference.chat import SamplingParams, complete, stop_ids
from minimind_lib.inference.serve.app import create_app
from minimind_lib.inference.serve.launch import BackgroundServer
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.tokenizer import encode_chat, load_tokenizer

TOK = load_tokenizer()
CONTEXT = 512
WAIT = 60  # seconds a browser step may take on a loaded 2-core machine before the test fails


class CountingSlowModel(MiniMindForCausalLM):
    """Counts forward passes of the trunk (one per generated token, on every generation path)
    and can sleep in each, so a test can stop an answer mid-stream and then watch the server
    stop computing."""

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__(config)
        self.calls, self.delay = 0, 0.0
        self.model.register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)


@pytest.fixture(scope="module")
def model():
    """Untrained, with large weights: greedy answers differ from prompt to prompt and almost
    never end early, so a long answer can be stopped halfway."""
    config = MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, max_position_embeddings=CONTEXT,
                            tie_word_embeddings=False)
    return noisy(CountingSlowModel(config))


@pytest.fixture(scope="module")
def server(model):
    app = create_app(model, TOK, model_name="tiny", model_card={"profile": "smoke",
                                                                "stage": "sft"})
    with BackgroundServer(app) as s:
        yield s


def api_answer(server, messages, max_tokens, **sampling):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **sampling}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


# --------------------------------------------------------------------------- no browser


def test_the_page_is_served_self_contained_with_its_elements(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    for element in ('id="prompt"', 'id="send"', 'id="stop"', 'id="temperature"',
                    'id="top-p"', 'id="max-tokens"', 'id="system"', 'id="model-card"'):
        assert element in page, element
    # works offline: no script, style, image or font from another host
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", page)
    assert "/v1/chat/completions" in page and "/v1/models" in page


def test_models_lists_the_model_card(server, model):
    entry = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert entry["id"] == "tiny" and entry["context_length"] == CONTEXT
    assert entry["parameters"] == model.num_parameters()
    assert (entry["profile"], entry["stage"]) == ("smoke", "sft")


def test_serve_reads_the_card_from_the_stage_folder(smoke_runs, tmp_path):
    from minimind_lib.__main__ import model_card

    assert model_card(smoke_runs / "sft") == {"profile": "smoke", "stage": "sft"}
    assert model_card(tmp_path) == {}  # a folder no stage wrote


# --------------------------------------------------------------------------- the browser

CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-extensions")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("THE CHAT PAGE'S BROWSER TESTS DID NOT RUN: chromium and chromium-driver "
                    "are not installed (`make browser` installs them with apt-get)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(browser, condition, what):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda b: condition(b), message=f"timed out waiting for {what}")


def js(browser, script, *args):
    return browser.execute_script(script, *args)


def state(browser):
    return js(browser, "return document.body.dataset.state")


def answers(browser):
    """(text, finish) of every assistant message; finish is None while it streams."""
    return js(browser, "return [...document.querySelectorAll('.assistant')]"
                       ".map(e => [e.textContent, e.dataset.finish || null])")


def fill(browser, element_id, value):
    element = browser.find_element("id", element_id)
    element.clear()
    element.send_keys(str(value))


def open_page(browser, server):
    browser.get(server.url + "/")
    until(browser, lambda b: "tiny" in b.find_element("id", "model-card").text, "the model card")


def ask(browser, text, n_answers):
    fill(browser, "prompt", text)
    browser.find_element("id", "send").click()
    until(browser, lambda b: len(answers(b)) == n_answers and answers(b)[-1][1] is not None
          and state(b) == "idle", f"answer {n_answers}")
    return answers(browser)[-1]


def test_the_page_shows_the_greedy_answers_the_api_gives(browser, server):
    open_page(browser, server)
    card = browser.find_element("id", "model-card").text
    assert all(s in card for s in ("M parameters", "profile smoke", "stage sft", "512 tokens"))
    assert state(browser) == "idle"
    fill(browser, "temperature", 0)
    fill(browser, "max-tokens", 24)

    text, finish = ask(browser, "hello, who are you?", 1)
    history = [{"role": "user", "content": "hello, who are you?"}]
    expected = api_answer(server, history, 24)
    assert text == expected and finish == "length"

    # the second turn carries the first (the conversation history), now with a system prompt
    fill(browser, "system", "You are a terse assistant.")
    text, _ = ask(browser, "tell me more", 2)
    history += [{"role": "assistant", "content": expected},
                {"role": "user", "content": "tell me more"}]
    expected = api_answer(server, [{"role": "system", "content": "You are a terse assistant."},
                                   *history], 24)
    assert text == expected
    user_bubbles = js(browser, "return [...document.querySelectorAll('.user')]"
                               ".map(e => e.textContent)")
    assert user_bubbles == ["hello, who are you?", "tell me more"]


def test_stop_ends_the_answer_and_the_generation(browser, server, model):
    """Stop mid-stream: the page keeps the prefix it showed, and the server stops computing
    (the worker is cancelled when the browser drops the stream)."""
    open_page(browser, server)
    fill(browser, "temperature", 0)
    max_tokens = 300
    fill(browser, "max-tokens", max_tokens)
    prompt = "write a long story"
    ids = encode_chat(TOK, [{"role": "user", "content": prompt}], add_generation_prompt=True)
    full = complete(model, TOK, ids, SamplingParams(max_tokens, temperature=0), stop_ids(TOK))
    assert full.finish_reason == "length"  # the test needs an answer that would run long

    model.delay = 0.05  # 300 tokens would take 15 s
    before = model.calls
    try:
        fill(browser, "prompt", prompt)
        browser.find_element("id", "send").click()
        until(browser, lambda b: state(b) == "generating" and len(answers(b)[-1][0]) >= 3,
              "the answer to start streaming")
        browser.find_element("id", "stop").click()
        until(browser, lambda b: state(b) == "idle" and answers(b)[-1][1] == "stopped",
              "the page to stop")
        shown = answers(browser)[-1][0]
        assert shown and full.text.startswith(shown) and len(shown) < len(full.text)
        # the worker stops at the next token once the stream is dropped: the count of forward
        # passes (one per token) stands still, well before the 300 tokens asked for
        assert wait_until_steady(lambda: model.calls) - before < max_tokens
    finally:
        model.delay = 0.0
    # and the server is free again: the next question is answered (a short one: the page sends
    # the stopped answer as history, longer the slower this machine, and prompt + max_tokens
    # must fit the context)
    fill(browser, "max-tokens", 24)
    text, finish = ask(browser, "hi", len(answers(browser)) + 1)
    assert finish in ("stop", "length"), text


def wait_until_steady(read, quiet=0.5, limit=WAIT):
    """``read()`` once it has not changed for ``quiet`` seconds."""
    deadline, last = time.monotonic() + limit, read()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = read()
        if now == last:
            return now
        last = now
    raise AssertionError(f"still changing after {limit} s")


def test_bad_settings_are_reported_on_the_page(browser, server):
    open_page(browser, server)
    fill(browser, "temperature", -1)  # refused by the page itself: nothing is sent
    fill(browser, "prompt", "hi")
    browser.find_element("id", "send").click()
    until(browser, lambda b: "Temperature" in b.find_element("id", "status").text,
          "the page's message")
    assert answers(browser) == [] and state(browser) == "idle"
    # refused by the server: the prompt plus 512 new tokens exceed the 512-token context
    fill(browser, "temperature", 0)
    fill(browser, "max-tokens", CONTEXT)
    text, finish = ask(browser, "hi", 1)
    assert finish == "error" and "exceeds the model's context" in text
    assert js(browser, "return document.querySelector('.assistant').classList.contains('error')")
    # the failed turn is not part of the conversation: the next answer is the first turn's
    fill(browser, "max-tokens", 8)
    assert ask(browser, "hello", 2)[0] == api_answer(server, [{"role": "user",
                                                              "content": "hello"}], 8)


@pytest.fixture(scope="module")
def tool_server():
    """A server whose model writes scripted replies: a tool call, then an answer."""
    scripted = ScriptedReplies(TOK)
    with BackgroundServer(create_app(scripted, TOK, model_name="scripted")) as s:
        s.model = scripted
        yield s


def click_example(browser, server, label):
    browser.get(server.url + "/")
    until(browser, lambda b: "scripted" in b.find_element("id", "model-card").text,
          "the model card")
    button = next(b for b in browser.find_elements("css selector", ".example")
                  if b.text == label)
    button.click()
    until(browser, lambda b: len(answers(b)) == 1 and answers(b)[0][1] is not None
          and state(b) == "idle", "the answer")


def test_a_calculator_question_shows_the_call_the_result_and_the_answer(browser, tool_server):
    tool_server.model.replies[:] = [
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "256 * 37"}}\n'
        '</tool_call>', "256 * 37 = 9472"]
    tool_server.model.prompts.clear()
    click_example(browser, tool_server, "What is 256 * 37?")  # switches Tools on, sends
    assert js(browser, "return document.getElementById('tools').checked")
    call = js(browser, "const c = document.querySelector('.assistant .tool-call');"
                       "return [c.querySelector('.call-name').textContent,"
                       "        c.querySelector('.call-arguments').textContent,"
                       "        c.querySelector('.call-result').textContent]")
    assert call == ["calculate", '({"expression": "256 * 37"})', '→ {"result": "9472"}']
    assert js(browser, "return document.querySelector('.assistant .answer').textContent") \
        == "256 * 37 = 9472"
    assert answers(browser)[0][1] == "stop"
    # the model was offered all the course's tools, and read the server-run result back
    assert '"name": "poem_author"' in tool_server.model.prompts[0]
    assert '<tool_response>\n{"result": "9472"}\n</tool_response>' in tool_server.model.prompts[1]


def test_thinking_is_shown_collapsed_above_the_answer(browser, tool_server):
    tool_server.model.replies[:] = ["12 + 7 = 19\n19 - 5 = 14\n</think>\n\n12 + 7 - 5 = 14"]
    click_example(browser, tool_server, "12 + 7 - 5 = ?")  # switches Thinking on
    box = js(browser, "const d = document.querySelector('.assistant details.reasoning');"
                      "return [d.open, d.querySelector('summary').textContent,"
                      "        d.lastChild.textContent]")
    assert box == [False, "Thinking", "12 + 7 = 19\n19 - 5 = 14"]
    assert js(browser, "return document.querySelector('.assistant .answer').textContent") \
        == "12 + 7 - 5 = 14"
    assert tool_server.model.prompts[-1].endswith("<think>\n")


def test_the_browser_fetched_nothing_from_elsewhere(browser, server):
    open_page(browser, server)
    hosts = js(browser, "return performance.getEntriesByType('resource')"
                        ".map(e => new URL(e.name).host)")
    assert hosts and set(hosts) == {server.url.split("//")[1]}
