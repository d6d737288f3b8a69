"""A person's visit to Cairn's Cockpit page, in headless Chromium inside the test machine
(Debian's chromium, chromedriver and python3-selenium); run there by test_console.py.

    python3 console_browser.py CONFIG_JSON

CONFIG_JSON: ``user``, ``password``, ``shots`` (a directory for the screenshots), then
either ``run_id`` (a run waiting on a question, then an approval), ``other`` and ``third``
(more waiting runs), ``doomed`` (a run waiting on an approval), ``facets`` (a finished run
with lanes, a worklist and an experiment) and ``answer`` (what to type), or ``blocked``,
``by_hand`` and ``result``.

With ``run_id``, it logs in at Cockpit's own login page, finds the page in the menu, reads
the runs list, answers the question and approves the approval in the inbox, rejects the
doomed run's approval and retries the failed run from the inbox, follows the first run to
its end on the run page and reverts it, pauses, resumes and cancels the other run from its
page and deletes its storage, stops the third, and reads the facets run's page. With
``blocked`` and ``by_hand`` (blocked runs) and ``result``, it runs the first one's
uncertain operation again from the inbox and records ``result`` as the other's. It prints
what it saw as one JSON line: the test judges it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

COCKPIT = "http://127.0.0.1:9090"
FRAME = "iframe[name='cockpit1:localhost/cairn']"
# Elements the page never makes itself: one in the page came from a value Cairn returned.
FOREIGN = ("script, img, svg, iframe, object, embed, details, style, math, "
           "*[onerror], *[onload], *[ontoggle]")
# Set by a payload that ran; `undefined` in a page where none did.
MARKS = "return [window.__xss, window.parent && window.parent.__xss, window.top.__xss]"


def wait(driver: WebDriver, what: Callable[[WebDriver], Any], seconds: float = 60) -> Any:
    return WebDriverWait(driver, seconds, poll_frequency=0.25,
                         ignored_exceptions=(StaleElementReferenceException,)).until(what)


def text_of(driver: WebDriver, css: str) -> str:
    """The element's text as it is shown (read in the page, so a redraw between finding
    it and reading it cannot interfere); "" when there is none."""
    return str(driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css))


def attributes(driver: WebDriver, css: str, name: str) -> list[str]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(e => e.getAttribute(arguments[1]))", css, name))


def into_page(driver: WebDriver, fragment: str) -> None:
    """The Cairn page at ``fragment`` inside Cockpit's shell, its frame selected."""
    driver.switch_to.default_content()
    driver.get(f"{COCKPIT}/cairn#{fragment}")
    frame = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, FRAME))[0]
    driver.switch_to.frame(frame)
    # drawn for this location (a new fragment does not reload the frame: the page redraws)
    drawn = json.dumps([p for p in fragment.split("/") if p], separators=(",", ":"))
    wait(driver, lambda d: d.find_element(By.ID, "view").get_attribute("data-loaded") == drawn)


def press(driver: WebDriver, how: str, what: str) -> None:
    """Click the element, found again if the page redrew it before the click landed."""
    wait(driver, lambda d: d.find_element(how, what).click() or True)


def act(driver: WebDriver, label: str, confirm: bool) -> str:
    """Press the run page's button ``label`` (accepting its confirmation) and return what
    the status line then says: what cairn printed."""
    draws = driver.execute_script("return document.getElementById('view').dataset.draws")
    press(driver, By.XPATH, f"//span[@class='cairn-actions']/button[text()='{label}']")
    if confirm:
        wait(driver, expected_conditions.alert_is_present())
        driver.switch_to.alert.accept()
    said = str(wait(driver, lambda d: text_of(d, "#status").strip(), 120))
    # the page drawn again after it, so the next button is the new state's
    wait(driver, lambda d: d.execute_script(
        "return document.getElementById('view').dataset.draws") != draws)
    return said


def foreign(driver: WebDriver) -> list[str]:
    return [html[:200] for html in driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.outerHTML)",
        f"#view :is({FOREIGN})")]


def log_in(driver: WebDriver, config: dict[str, Any]) -> list[str]:
    """Log in at Cockpit's login page; the links of its menu named Cairn."""
    driver.get(COCKPIT + "/")
    wait(driver, lambda d: d.find_element(By.ID, "login-user-input").is_displayed())
    driver.find_element(By.ID, "login-user-input").send_keys(config["user"])
    driver.find_element(By.ID, "login-password-input").send_keys(config["password"])
    press(driver, By.ID, "login-button")
    return list(wait(driver, lambda d: d.execute_script(
        "return [...document.querySelectorAll('a')]"
        ".filter(a => a.innerText.trim() === 'Cairn').map(a => a.href)"), 90))


def confirm_press(driver: WebDriver, xpath: str) -> None:
    press(driver, By.XPATH, xpath)
    wait(driver, expected_conditions.alert_is_present())
    driver.switch_to.alert.accept()


def retry_failed(driver: WebDriver, config: dict[str, Any], seen: dict[str, Any],
                 shots: Path) -> None:
    """Reject the doomed run's approval; once it failed, retry it from the inbox."""
    doomed = config["doomed"]
    confirm_press(driver, f"//li[@data-run='{doomed}' and @data-kind='approval']"
                  "//button[text()='Reject']")
    wait(driver, lambda d: "rejected" in text_of(d, "#status"))
    seen["rejected"] = text_of(driver, "#status").strip()
    item = f"li[data-kind='failed'][data-run='{doomed}']"
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, item), 120)
    seen["failed_error"] = text_of(driver, f"{item} .cairn-question")
    seen["failed_command"] = text_of(driver, f"{item} .cairn-commands")
    seen["foreign"]["failed"] = foreign(driver)
    seen["marks"].append(driver.execute_script(MARKS))
    driver.execute_script("document.querySelector(arguments[0]).scrollIntoView()", item)
    driver.save_screenshot(str(shots / "failed.png"))
    confirm_press(driver, f"//li[@data-run='{doomed}' and @data-kind='failed']"
                  "//button[starts-with(text(), 'Retry from ')]")

    def new_run(d: WebDriver) -> str | None:
        loaded = str(d.find_element(By.ID, "view").get_attribute("data-loaded"))
        return loaded if loaded.startswith('["run"') and doomed not in loaded else None

    seen["retried"] = json.loads(wait(driver, new_run, 120))[1]
    wait(driver, lambda d: d.find_elements(By.ID, "replayed-from"))
    seen["replayed_from"] = text_of(driver, "#replayed-from")
    into_page(driver, "/inbox")  # retried: no longer among the failed runs to act on
    seen["failed_after_retry"] = [e.get_attribute("data-run") for e in
                                  driver.find_elements(By.CSS_SELECTOR, "li[data-kind='failed']")]


def read_facets(driver: WebDriver, config: dict[str, Any], seen: dict[str, Any],
                shots: Path) -> None:
    """The facets run's page: its operations tree, checkpoints, worklist, experiment."""
    into_page(driver, f"/run/{config['facets']}")
    seen["tree"] = driver.execute_script(
        "return [...document.querySelectorAll('#operations tbody tr')].map(r => r.dataset.lane"
        " !== undefined ? ['lane', r.dataset.lane, r.dataset.depth]"
        " : ['op', r.dataset.op, r.dataset.depth])")
    seen["checkpoints"] = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#operations tr[data-op]')]"
        ".map(r => [r.dataset.op, r.querySelector('td[data-label=Checkpoint]').innerText]))")
    seen["worklist"] = driver.execute_script(
        "return [...document.querySelectorAll('#worklists li')]"
        ".map(li => [li.dataset.state, li.innerText.slice(2)])")
    seen["dispositions"] = attributes(driver, "#experiments tr[data-disposition]",
                                      "data-disposition")
    seen["phases"] = attributes(driver, "#progress [data-phase]", "data-phase")
    seen["worklist_title"] = text_of(driver, "#worklists .cairn-kind")
    seen["foreign"]["facets"] = foreign(driver)
    seen["marks"].append(driver.execute_script(MARKS))
    driver.execute_script("document.getElementById('operations').scrollIntoView()")
    driver.save_screenshot(str(shots / "lanes.png"))


def read_style(driver: WebDriver, seen: dict[str, Any], shots: Path) -> None:
    """PatternFly in the page (a token of Cockpit's stylesheet and a button drawn by it),
    then Cockpit's dark style chosen in the shell: the page follows."""
    seen["pf_token"] = driver.execute_script(
        "return getComputedStyle(document.documentElement)"
        ".getPropertyValue('--pf-t--global--background--color--primary--default').trim()")
    seen["pf_button"] = driver.execute_script(
        "const b = document.querySelector('.pf-v6-c-button');"
        "return b ? getComputedStyle(b).getPropertyValue('--pf-v6-c-button--BorderRadius') : ''")
    background = "return getComputedStyle(document.body).backgroundColor"
    seen["light"] = driver.execute_script(background)
    driver.switch_to.default_content()
    driver.execute_script("localStorage.setItem('shell:style', 'dark')")
    driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, FRAME))
    wait(driver, lambda d: d.execute_script(
        "return document.documentElement.classList.contains('pf-v6-theme-dark')"))
    seen["dark"] = driver.execute_script(background)
    driver.save_screenshot(str(shots / "run-dark.png"))


def run_blocked_again(driver: WebDriver, config: dict[str, Any], seen: dict[str, Any],
                      shots: Path) -> None:
    """The blocked run's item in the inbox: its choices; run the operation again."""
    run_id = config["blocked"]
    into_page(driver, "/inbox")
    item = f"li[data-kind='blocked'][data-run='{run_id}']"
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, item))
    seen["commands"] = text_of(driver, f"{item} .cairn-commands")
    seen["choices"] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(b => b.innerText)",
        f"{item} button")
    seen["foreign"] = foreign(driver)
    seen["marks"] = driver.execute_script(MARKS)
    driver.save_screenshot(str(shots / "blocked.png"))
    confirm_press(driver, f"//li[@data-run='{run_id}' and @data-kind='blocked']"
                  "//button[text()='Run again']")
    wait(driver, lambda d: "resumes" in text_of(d, "#status"), 120)
    seen["retried"] = text_of(driver, "#status").strip()
    into_page(driver, f"/run/{run_id}")
    wait(driver, lambda d: d.find_elements(
        By.CSS_SELECTOR, ".cairn-toolbar .cairn-state-succeeded, "
        ".cairn-toolbar .cairn-state-failed, .cairn-toolbar .cairn-state-blocked"), 240)
    seen["state"] = text_of(driver, ".cairn-toolbar .cairn-state")
    into_page(driver, "/inbox")
    other = f"li[data-kind='blocked'][data-run='{config['by_hand']}']"
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"{other} textarea").send_keys(
        config["result"]) or True)
    press(driver, By.XPATH, f"//li[@data-run='{config['by_hand']}' and @data-kind='blocked']"
          "//button[text()='Record result']")
    wait(driver, lambda d: "decided" in text_of(d, "#status"), 120)
    seen["decided"] = text_of(driver, "#status").strip()


def keyboard_to_a_run(driver: WebDriver, seen: dict[str, Any]) -> None:
    """From the runs list with only the keyboard: Tab to the first run's link (each stop
    drawn with a visible focus ring), Enter opens the run."""
    first = attributes(driver, "#runs tbody tr", "data-run")[0]
    driver.find_element(By.ID, "runs-heading").click()  # no control there: focus stays out
    seen["tab_stops"] = []
    for _ in range(20):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        stop = driver.execute_script(
            "const e = document.activeElement; const s = getComputedStyle(e);"
            "return [e.id || e.innerText.trim().slice(0, 40), s.outlineStyle]")
        seen["tab_stops"].append(stop)
        if stop[0] == first:
            break
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    opened = json.dumps(["run", first], separators=(",", ":"))
    wait(driver, lambda d: d.find_element(By.ID, "view").get_attribute("data-loaded") == opened)
    seen["keyboard_opened"] = first


def visit(config: dict[str, Any]) -> dict[str, Any]:
    shots = Path(config["shots"])
    shots.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    seen: dict[str, Any] = {"marks": [], "actions": {}}
    try:
        seen["menu"] = log_in(driver, config)
        if "blocked" in config:
            run_blocked_again(driver, config, seen, shots)
            return seen

        into_page(driver, "/")
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#runs tbody tr"))
        seen["runs"] = attributes(driver, "#runs tbody tr", "data-run")
        seen["foreign"] = {"runs": foreign(driver)}
        seen["marks"].append(driver.execute_script(MARKS))
        driver.save_screenshot(str(shots / "runs.png"))
        driver.set_window_size(390, 844)  # a phone
        driver.save_screenshot(str(shots / "runs-phone.png"))
        seen["phone_overflow"] = driver.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth")
        driver.set_window_size(1280, 900)
        keyboard_to_a_run(driver, seen)
        # what cairn refuses, the page says in cairn's words
        into_page(driver, "/run/flow_0000")
        seen["refused"] = text_of(driver, ".cairn-error")

        into_page(driver, "/inbox")
        item = f"li[data-kind='question'][data-run='{config['run_id']}']"
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, item))
        seen["question"] = text_of(driver, f"{item} .cairn-question")
        seen["foreign"]["inbox"] = foreign(driver)
        seen["marks"].append(driver.execute_script(MARKS))
        seen["inbox_count"] = text_of(driver, "#inbox-count")
        driver.save_screenshot(str(shots / "inbox.png"))
        wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f"{item} textarea").send_keys(
            config["answer"]) or True)
        press(driver, By.CSS_SELECTOR, f"{item} button")
        wait(driver, lambda d: text_of(d, "#status").strip())
        seen["answered"] = text_of(driver, "#status").strip()

        approval = f"li[data-kind='approval'][data-run='{config['run_id']}']"
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, approval), 120)
        seen["approval"] = text_of(driver, f"{approval} .cairn-question")
        seen["fingerprint"] = text_of(driver, f"{approval} .cairn-fingerprint")
        seen["foreign"]["approval"] = foreign(driver)
        seen["marks"].append(driver.execute_script(MARKS))
        driver.save_screenshot(str(shots / "approval.png"))
        press(driver, By.XPATH, f"//li[@data-run='{config['run_id']}' and "
              "@data-kind='approval']//button[text()='Approve']")
        wait(driver, lambda d: "approved" in text_of(d, "#status"))
        seen["approved"] = text_of(driver, "#status").strip()
        retry_failed(driver, config, seen, shots)

        into_page(driver, f"/run/{config['run_id']}")
        try:
            wait(driver, lambda d: d.find_elements(
                By.CSS_SELECTOR, ".cairn-toolbar .cairn-state-succeeded, "
                ".cairn-toolbar .cairn-state-failed") and d.find_elements(By.ID, "diff"), 240)
        except TimeoutException:
            seen["timeout"] = text_of(driver, "#view")[-2000:]
        seen["state"] = text_of(driver, ".cairn-toolbar .cairn-state")
        seen["diff"] = text_of(driver, "#diff")
        seen["output"] = text_of(driver, "#run-output")
        seen["logs"] = text_of(driver, "#logs")
        seen["foreign"]["run"] = foreign(driver)
        seen["marks"].append(driver.execute_script(MARKS))
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(shots / "run.png"))
        seen["actions"]["Revert"] = act(driver, "Revert", True)
        wait(driver, lambda d: d.find_elements(By.ID, "reverted"))
        seen["reverted"] = text_of(driver, "#reverted")
        # the page's own errors, and any script a Content Security Policy had to refuse
        # (Cockpit's shell logs its login probe and missing fonts: not the page's)
        into_page(driver, f"/run/{config['other']}")
        seen["actions"].update({label: act(driver, label, confirm)
                                for label, confirm in (("Pause", False), ("Resume", False),
                                                       ("Cancel", True))})
        wait(driver, lambda d: text_of(d, ".cairn-toolbar .cairn-state") == "cancelled", 120)
        seen["cancelled"] = text_of(driver, ".cairn-toolbar .cairn-state")
        # the coordinator may still be on its way out: cairn refuses until it is, and a
        # person would press again
        deadline = time.monotonic() + 60
        while "has not ended" in (said := act(driver, "Delete storage", True)) \
                and time.monotonic() < deadline:
            time.sleep(1)
        seen["actions"]["Delete storage"] = said
        into_page(driver, f"/run/{config['third']}")
        seen["actions"]["Stop"] = act(driver, "Stop", True)
        seen["stopped"] = text_of(driver, ".cairn-toolbar .cairn-state")
        read_facets(driver, config, seen, shots)
        read_style(driver, seen, shots)

        seen["console"] = [e["message"][:300] for e in driver.get_log("browser")
                           if e["level"] == "SEVERE" and ("/cairn/" in e["message"]
                                                          or "Refused" in e["message"])]
    except (TimeoutException, WebDriverException) as exc:
        seen["error"] = f"{type(exc).__name__}: {exc.msg}"
        seen["status"] = text_of(driver, "#status")
        seen["log"] = [e["message"][:500] for e in driver.get_log("browser")]
        driver.switch_to.default_content()
        seen["page"] = text_of(driver, "body")[-2000:]
        driver.save_screenshot(str(shots / "failed.png"))
    finally:
        driver.quit()
    return seen


if __name__ == "__main__":
    print(json.dumps(visit(json.loads(sys.argv[1]))), flush=True)
