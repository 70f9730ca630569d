"""The chat page in a real headless Chromium (Debian's chromium + chromium-driver via selenium):
type a message, press Send, see the reply stream in; a second turn keeps the conversation.
Each reply shown must equal the API's greedy reply to the same conversation. A screenshot is
saved in the test's tmp dir (docs/chat_page.png in the README is one of these).

Skipped, with the reason, when Chromium or its driver is not installed; `.ci/run` installs
them on CI so there it always runs.
"""

from __future__ import annotations

import re
import shutil
import time

import openai
import pytest

from server.engine import Engine
from tests.server.conftest import make_run_dir, start_server
from tests.server.test_bad_input import health, wait_until_idle

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="no Chromium here: `apt-get install -y chromium chromium-driver` to run this test")


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1100,640", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    # The driver is given explicitly, so selenium never tries to download one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def greedy_api_reply(server, messages, max_tokens: int = MAX_TOKENS) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model="run", messages=messages, temperature=0,
                                          max_tokens=max_tokens).choices[0].message.content


def send_and_wait_for_reply(driver, text: str, turn: int, click: bool = True):
    """Send `text` (unless `click` is False: the reply was asked for otherwise) and wait for
    the `turn`-th reply to be done."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    if click:
        driver.find_element(By.ID, "message").send_keys(text)
        driver.find_element(By.ID, "send").click()
    done = ".message.assistant.done"
    WebDriverWait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, done)) == turn)
    return driver.find_elements(By.CSS_SELECTOR, done)[-1]


def test_chat_page_streams_a_reply_and_keeps_the_conversation(browser, live_server, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server.url}/")
    for field, value in (("temperature", "0"), ("max-tokens", str(MAX_TOKENS))):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)

    first = send_and_wait_for_reply(browser, "What is 2 + 3?", turn=1)
    first_text = first.get_attribute("textContent")
    assert "error" not in first.get_attribute("class"), first_text
    assert int(first.get_attribute("data-chunks")) > 1  # it arrived piece by piece
    conversation = [{"role": "user", "content": "What is 2 + 3?"}]
    assert first_text == greedy_api_reply(live_server, conversation)

    second = send_and_wait_for_reply(browser, "and 4 + 4?", turn=2)
    conversation += [{"role": "assistant", "content": first_text},
                     {"role": "user", "content": "and 4 + 4?"}]
    assert second.get_attribute("textContent") == greedy_api_reply(live_server, conversation)
    assert "tokens/s" in browser.find_element(By.ID, "stats").text

    screenshot = tmp_path / "chat_page.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"\nscreenshot: {screenshot}")


DEMO_CONTEXT = 256  # the demo model's context; the page's default max tokens is 200


@pytest.fixture
def demo_sized_server(tmp_path, tiny_hf_tokenizer_dir):
    server = start_server(make_run_dir(tmp_path, tiny_hf_tokenizer_dir, context=DEMO_CONTEXT))
    yield server
    server.stop()


def sent_messages(driver, conversation: list[dict]) -> list[dict]:
    """The turns the page sent for its last reply: it says how many it left out."""
    from selenium.webdriver.common.by import By

    context_line = driver.find_element(By.ID, "context").text
    left_out = re.search(r"(\d+) earlier messages left out", context_line)
    return conversation[int(left_out.group(1)) if left_out else 0:]


def test_six_turns_fit_the_demo_context_with_the_default_max_tokens(browser, demo_sized_server):
    """Each reply is the API's greedy reply to the turns the page sent, with the max tokens it
    computed from the context left (at most the field's 200); none is an error."""
    from selenium.webdriver.common.by import By

    browser.get(f"{demo_sized_server.url}/")
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")
    conversation: list[dict] = []
    for turn in range(1, 7):
        text = f"Question {turn}: what comes next?"
        conversation.append({"role": "user", "content": text})
        reply = send_and_wait_for_reply(browser, text, turn)
        reply_text = reply.get_attribute("textContent")
        assert "error" not in reply.get_attribute("class"), reply_text
        max_tokens = int(reply.get_attribute("data-max-tokens"))
        assert 1 <= max_tokens <= 200
        assert reply_text == greedy_api_reply(demo_sized_server,
                                              sent_messages(browser, conversation), max_tokens)
        conversation.append({"role": "assistant", "content": reply_text})
        assert f"of {DEMO_CONTEXT} tokens used" in browser.find_element(By.ID, "context").text
    # Regenerate asks again for the last reply: greedy, so the same text, in the same place.
    browser.find_element(By.ID, "regenerate").click()
    again = send_and_wait_for_reply(browser, "", turn=6, click=False)
    assert again.get_attribute("textContent") == conversation[-1]["content"]
    assert len(browser.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 6


def test_stop_ends_the_reply_and_frees_its_row(browser, demo_sized_server, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    real_step = Engine._step

    def slow_step(engine):  # 200 tokens would take 10 s: Stop comes first
        time.sleep(0.05)
        real_step(engine)

    prompt = "Question 1: what comes next?"
    client = openai.OpenAI(base_url=f"{demo_sized_server.url}/v1", api_key="-", max_retries=0)
    whole = client.chat.completions.create(model="run", temperature=0, max_tokens=200,
                                           messages=[{"role": "user", "content": prompt}])
    assert whole.choices[0].finish_reason == "length"  # so only Stop can end it early
    monkeypatch.setattr(Engine, "_step", slow_step)
    browser.get(f"{demo_sized_server.url}/")
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")
    browser.find_element(By.ID, "message").send_keys(prompt)
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 30).until(lambda d: int(d.find_element(
        By.CSS_SELECTOR, ".message.assistant").get_attribute("data-chunks") or 0) >= 2)
    browser.find_element(By.ID, "stop").click()
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant.done"))
    assert "finish: stopped" in browser.find_element(By.ID, "stats").text
    wait_until_idle(demo_sized_server)
    assert health(demo_sized_server)["finished"]["cancelled"] == 1
    assert browser.find_element(By.ID, "regenerate").is_enabled()
