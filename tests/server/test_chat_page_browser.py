"""The chat page in a real headless Chromium (Debian's chromium + chromium-driver via selenium):
type a message, press Send, see the reply stream in; a second turn keeps the conversation.
Each reply shown must equal the API's greedy reply to the same conversation. A screenshot is
saved in the test's tmp dir (docs/chat_page.png in the README is one of these).

Skipped, with the reason, when Chromium or its driver is not installed; `.ci/run` installs
them on CI so there it always runs.
"""

from __future__ import annotations

import shutil

import openai
import pytest

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


def greedy_api_reply(server, messages) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model="m", messages=messages, temperature=0,
                                          max_tokens=MAX_TOKENS).choices[0].message.content


def send_and_wait_for_reply(driver, text: str, turn: int):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

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
