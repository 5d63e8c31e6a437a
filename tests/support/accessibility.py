"""axe-core in the browser tests: the engine comes from the `axe-playwright-python` package
(a test extra), which bundles axe.min.js; it is injected into the page as it stands and run
there, so what it judges is what a participant's browser shows (styles, contrast, names)."""

from importlib.resources import files

SERIOUS = ("serious", "critical")


def axe_violations(page, impacts=SERIOUS) -> list[str]:
    """axe's violations of WCAG 2 A and AA (contrast included) on `page`, as readable lines
    ("rule: help: the elements"), of the given impacts. The page's context must be made with
    bypass_csp=True: the study pages' CSP refuses any script without its nonce."""
    page.add_script_tag(content=(files("axe_playwright_python") / "axe.min.js").read_text())
    result = page.evaluate(
        """() => axe.run(document, {runOnly: {type: "tag",
            values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]}})"""
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: "
        + "; ".join(", ".join(node["target"]) for node in v["nodes"][:5])
        for v in result["violations"]
        if v["impact"] in impacts
    ]
