"""The status page's own files (`/`, `/page/status.js`, `/page/status.css`) as a browser
gets them: each with one Content-Type naming one charset."""

import pytest

from provisiond.api import create_app


@pytest.mark.parametrize("path, mimetype", [
    ("/", "text/html"), ("/page/status.js", "text/javascript"),
    ("/page/status.css", "text/css")])
def test_each_page_file_has_one_content_type_with_one_charset(config, path, mimetype):
    response = create_app(config).test_client().get(path)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == f"{mimetype}; charset=utf-8"
