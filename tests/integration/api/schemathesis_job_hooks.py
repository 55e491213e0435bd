"""schemathesis hooks of the job-start run (test_schemathesis.py, loaded through
SCHEMATHESIS_HOOKS): a body's `names` is also drawn from the nodes the test's serve has, or
every name the fuzzer makes up is a 404 and no job ever starts. Each kind of job gets nodes
of its own, so that one kind's running job does not make every start of the next a 409
(a reprovision waits for a boot that never comes). A firmware image URL is also drawn from
one on loopback (the test's BMCs never fetch it: sushy-tools' libvirt driver answers
SimpleUpdate with a finished task, IPMI has no firmware update). The generated body is kept
too: a body naming other nodes must be refused."""

from __future__ import annotations

import schemathesis
from hypothesis import strategies as st

NODES = {"/power": ("n1", "n1,n2"), "/bootdev": ("n2", "n[2-3]"), "/firmware/update": ("n3",),
         "/reprovision": ("n4",)}
IMAGE = "http://127.0.0.1:9/firmware.bin"  # the discard port: nothing listens


@schemathesis.hook
def flatmap_body(context, body):
    path = context.operation.path if context.operation else ""
    names = next((names for end, names in NODES.items() if path.endswith(end)), None)
    if names and isinstance(body, dict) and isinstance(body.get("names"), str):
        image = {"image": IMAGE} if "image" in body else {}
        ours = st.sampled_from(names).map(lambda name: {**body, "names": name, **image})
        return st.one_of(ours, st.just(body))
    return st.just(body)
