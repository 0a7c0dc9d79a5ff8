"""Small HTML helpers shared by the dashboard's renderers: escaping, outcome pills, safe links, labels.

Every string that comes from a run (check ids, messages, fingerprint values, links) goes through `e()` or
`link()`, so a message containing markup renders as text and a link can only be http(s).
"""

from __future__ import annotations

import hashlib
import re
from html import escape
from urllib.parse import urlparse

OUTCOME_SHORT = {"passed": "pass", "failed": "fail", "error": "error", "skipped": "skip",
                 "xfailed": "xfail", "xpassed": "xpass"}
CLASS_LABEL = {"new_failure": "new failure", "known_bug": "known bug", "capability_gap": "capability gap",
               "timeout": "timeout", "crash": "crash", "could_not_run": "could not run",
               "shared_gpu": "GPU shared", "slower_host": "slower host",
               "unlike_pin": "pin of another mix"}
_GITHUB = re.compile(r"^/([^/]+)/([^/]+)/(?:issues|pull)/(\d+)")


def e(value: object) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return escape("" if value is None else str(value), quote=True)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def pill(outcome: str, extra: str = "") -> str:
    return f'<span class="pill o-{e(outcome)}">{e(OUTCOME_SHORT.get(outcome, outcome))}{extra}</span>'


def class_badge(failure_class: str | None) -> str:
    if not failure_class:
        return ""
    label = CLASS_LABEL.get(failure_class, failure_class)
    return f'<span class="badge c-{e(failure_class)}">{e(label)}</span>'


def target_badge(target: str) -> str:
    return f'<span class="tgt t-{e(target)}">{e(target)}</span>'


def platform_short(target: str, label: str) -> str:
    """Badge + device only (``[ROCM] gfx942``), the full label in a tooltip: for crowded table cells."""
    device = label.split(" / ")[0].removeprefix(target).strip() or target
    return f'<span class="plat" title="{e(label)}">{target_badge(target)}{e(device)}</span>'


def link_text(url: str) -> str:
    """`https://github.com/vllm-project/vllm/issues/27722` → `vllm-project/vllm#27722`; else the host."""
    parsed = urlparse(url)
    match = _GITHUB.match(parsed.path) if parsed.netloc.endswith("github.com") else None
    return f"{match.group(1)}/{match.group(2)}#{match.group(3)}" if match else (parsed.netloc or url)


def link(url: str | None, text: str | None = None) -> str:
    """An outbound link (opened only when clicked); anything but http(s) is shown as plain text."""
    if not url:
        return ""
    if not url.startswith(("https://", "http://")):
        return e(text or url)
    return f'<a class="ext" href="{e(url)}" rel="noopener noreferrer">{e(text or link_text(url))}</a>'


def short_check(check_id: str) -> str:
    """`conformance/checks/test_logit_parity.py::test_x[bf16]` → `test_logit_parity › test_x[bf16]`."""
    path, _, name = check_id.partition("::")
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module} › {name.replace('::', ' › ')}" if name else module


def check_page(check_id: str) -> str:
    """The file name of a check's page under `checks/`: readable, and unique through a hash of the full id."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", short_check(check_id)).strip("_")[:80]
    return f"{readable}-{hashlib.sha1(check_id.encode()).hexdigest()[:10]}.html"


def check_cell(check_id: str, base: str = "") -> str:
    """A check's short name, linked to its page (`base`: the way from this page to the site's root)."""
    return (f'<a class="check" href="{e(base)}checks/{e(check_page(check_id))}" title="{e(check_id)}">'
            f"{e(short_check(check_id))}</a>")


def run_link(run_id: str, base: str = "") -> str:
    """A run id, linked to the run's page."""
    return f'<a class="run" href="{e(base)}runs/{e(run_id)}.html"><code>{e(run_id)}</code></a>'


def verdict_badge(state: str) -> str:
    return f'<span class="verdict v-{e(state.replace(" ", "-"))}" data-verdict="{e(state)}">{e(state)}</span>'


def clip(text: str, limit: int = 400) -> str:
    """Escaped text, the first `limit` characters shown and the rest behind a <details>."""
    if len(text) <= limit:
        return f'<span class="msg">{e(text)}</span>'
    return (f'<details class="msg"><summary>{e(text[:limit])}…</summary>'
            f'<pre>{e(text)}</pre></details>')


def first_line(text: str, limit: int = 160) -> str:
    """The first line of `text`, cut to `limit` characters (unescaped: pass it through e())."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def table(head: list[str], rows: list[str], cls: str = "", attrs: str = "") -> str:
    """A table from pre-escaped header cells and pre-rendered <tr> rows."""
    header = "".join(f"<th>{h}</th>" for h in head)
    return (f'<div class="scroll"><table class="{cls}" {attrs}><thead><tr>{header}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def section(anchor: str, title: str, body: str, intro: str = "") -> str:
    intro_html = f'<p class="intro">{intro}</p>' if intro else ""
    return f'<section id="{anchor}"><h2>{e(title)}</h2>{intro_html}{body}</section>'


def score_style(score: float | None) -> str:
    """A background from red (0) through amber to green (1) for score cells."""
    if score is None:
        return ""
    hue = round(score * 120)
    return f'style="background:hsl({hue} 70% 92%)"'
