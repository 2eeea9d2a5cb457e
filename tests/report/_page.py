"""Reading a report page back: its numbers (data-key → data-value and shown text), stages,
missing steps, findings, figures and every URL it would fetch. One parser for the HTML that
gradspec writes and for the DOM a browser dumps."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Page:
    numbers: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (data-value, text)
    duplicates: list[str] = field(default_factory=list)
    stages: dict[str, str] = field(default_factory=dict)  # name -> state
    missing: dict[str, str] = field(default_factory=dict)  # stage -> its line
    findings: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    images: list[str] = field(default_factory=list)  # img src
    urls: list[str] = field(default_factory=list)  # every src/href/action/srcset value
    tags: set[str] = field(default_factory=set)
    title: str = ""
    csp: str = ""
    text: str = ""

    def value(self, key: str) -> float:
        return float(self.numbers[key][0])

    def shown(self, key: str) -> str:
        return self.numbers[key][1]


VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                  "track", "wbr"})


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._open: list[list] = []  # [kind, key, attr, text parts, depth]
        self._depth = 0
        self._in_title = False
        self._chunks: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.page.tags.add(tag)
        if tag not in VOID:
            self._depth += 1
        for name in ("src", "href", "action", "srcset", "poster", "data"):
            if a.get(name):
                self.page.urls.append(a[name])
        if tag == "img":
            self.page.images.append(a.get("src", ""))
        if tag == "meta" and a.get("http-equiv", "").lower() == "content-security-policy":
            self.page.csp = a.get("content", "")
        if tag == "title":
            self._in_title = True
        if "data-key" in a:
            self._open.append(["num", a["data-key"], a.get("data-value", ""), [], self._depth])
        elif "data-stage" in a:
            self.page.stages[a["data-stage"]] = a.get("data-state", "")
        elif "data-missing" in a:
            self._open.append(["missing", a["data-missing"], "", [], self._depth])
        elif "data-level" in a:
            self._open.append(["finding", a["data-level"], "", [], self._depth])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self._depth -= 1

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if tag == "title":
            self._in_title = False
        if self._open and self._open[-1][4] == self._depth:
            kind, key, value, parts, _ = self._open.pop()
            text = "".join(parts).strip()
            if kind == "num":
                if key in self.page.numbers:
                    self.page.duplicates.append(key)
                self.page.numbers[key] = (value, text)
            elif kind == "missing":
                self.page.missing[key] = text
            else:
                self.page.findings.append((key, text))
        self._depth -= 1

    def handle_data(self, data):
        if self._in_title:
            self.page.title += data
        for entry in self._open:
            entry[3].append(data)
        self._chunks.append(data)

    def close(self):
        super().close()
        self.page.text = " ".join(" ".join(self._chunks).split())


def parse(html: str) -> Page:
    p = _Parser()
    p.feed(html)
    p.close()
    return p.page


def svg_root(uri: str) -> ET.Element:
    """The SVG document of a ``data:image/svg+xml;base64,`` image (parsed: it is well formed)."""
    head, _, data = uri.partition(",")
    assert head == "data:image/svg+xml;base64", head
    return ET.fromstring(base64.b64decode(data))
