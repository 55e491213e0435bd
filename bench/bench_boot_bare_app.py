"""The baseline for the iPXE benchmark: a bare Flask route rendering a compiled template."""

import jinja2
from flask import Flask, Response

app = Flask(__name__)
TEMPLATE = jinja2.Environment().from_string(
    "#!ipxe\nkernel http://10.0.0.1:9873/blobs/sha256/{{ k }} initrd=l0 initrd=l1 {{ mac }}\n"
    "{% for i in range(3) %}initrd --name l{{ i }} http://10.0.0.1:9873/blobs/{{ i }}\n"
    "{% endfor %}boot\n")


@app.get("/boot/ipxe/<mac>")
def script(mac: str):
    return Response(TEMPLATE.render(k="0" * 64, mac=mac), mimetype="text/plain")
