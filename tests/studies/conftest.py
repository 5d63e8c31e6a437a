import os

import pytest
from django.test import override_settings

from tests.support.processes import IN_CI, need
from tests.support.prolific_server import FakeProlific
from tests.support.studies import (
    CHROMIUM,
    FLAGS,
    SECRET,
    TOKEN,
    make_study,
)


@pytest.fixture
def study(db):
    return make_study()


@pytest.fixture
def browser():
    need(os.path.exists(CHROMIUM) or IN_CI, "needs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def fake():
    with FakeProlific(TOKEN) as server:
        with override_settings(
            PROLIFIC_API_TOKEN=TOKEN,
            PROLIFIC_API_URL=server.url,
            PROLIFIC_WEBHOOK_SECRET=SECRET,
            PROLIFIC_BONUS_CONFIRM_AFTER=3600,
        ):
            yield server


@pytest.fixture
def linked(db):
    return make_study(slug="pro", prolific_study_id="STUDYP")
