"""What people open in a browser: the API's own documentation and the console.

Everything a page loads is shipped in the Python package (Swagger UI and ReDoc
from ``fastapi-offline``, the console's own HTML, script and style from
``static/``), so the pages work on a network with no way out; every URL a page
uses is relative, so they work the same under a path prefix (docs/console.md).
"""
