"""A firmware URL's user and password (`http://USER:PASSWORD@host/fw.bin`): in no job record,
no runner's argv, no file other local users may read, no result, error or event; kept apart
(0600) while the job is pending or running, for its runner, and removed as it ends. Records
an older release wrote with them are rewritten without them."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from provisiond import events, jobs
from provisiond.atomic import write_atomic
from provisiond.errors import InvalidInput
from provisiond.jobs import runner, store
from provisiond.jobs.model import Job
from provisiond.power.fake import read_fake_bmcs
from provisiond.power.firmware_url import check_firmware_url
from provisiond.state.layout import Layout
from provisiond.states import JobKind, JobState
from tests.unit.power.redfish_bmc import PASSWORD, USER, start_redfish_bmc
from tests.waits import wait_until

SECRET = "pw-S3cret"
URL = f"http://fw:{SECRET}@127.0.0.1/bios.bin"
SHOWN = "http://127.0.0.1/bios.bin"


@pytest.fixture
def nodes(cli):
    assert cli("node", "add", "n[1-3]", "--bmc-driver", "fake", "--bmc-address", "bmc").code == 0
    return cli


@pytest.fixture
def redfish_node(cli, monkeypatch):
    """(cli, BMC state) with node r1 on the stand-in Redfish BMC of tests/unit/power."""
    server, state = start_redfish_bmc()
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD))
    added = cli("node", "add", "r1", "--bmc-driver", "redfish", "--bmc-address", "127.0.0.1",
                "--bmc-port", str(server.server_address[1]), "--bmc-scheme", "http",
                "--bmc-username", USER, "--bmc-password-stdin")
    assert added.code == 0, added.err
    yield cli, state
    state.release.set()
    server.shutdown()
    server.server_close()


def readable_by_others(config) -> str:
    """The text of the files under jobs/ that every local user may read."""
    return "\n".join(path.read_text(errors="replace")
                     for path in Layout.of(config).jobs.iterdir()
                     if path.is_file() and path.stat().st_mode & stat.S_IROTH)


def fake_bmcs(config) -> dict:
    return read_fake_bmcs(config.state_dir / "power" / "fake-bmcs.json")


def test_the_credentials_wait_apart_0600_for_the_runner_and_go_as_the_job_ends(nodes, config):
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL, "timeout": 60.0},
                       "cli:test")
    assert (job.params["image"], job.secret_params) == (SHOWN, ["image"])
    secret = store.secret_path(config, job.id)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert json.loads(secret.read_text()) == {"image": URL}
    assert SECRET not in readable_by_others(config)
    assert runner.run(config, job.id) == 0
    assert fake_bmcs(config)["n1"]["last_image"] == URL  # the BMC gets it whole
    assert store.read(config, job.id).state is JobState.FINISHED
    assert not secret.exists() and SECRET not in store.job_path(config, job.id).read_text()


def test_a_started_runner_has_them_in_no_argv_and_no_readable_file(redfish_node, config):
    cli, bmc = redfish_node
    bmc.task_polls_running = 10 ** 6  # the runner polls the task until let go
    started = jobs.start(config, JobKind.FIRMWARE_UPDATE, ["r1"], {"image": URL, "timeout": 60},
                         "token:op")
    wait_until(lambda: bmc.image_uri, 60, "the runner asks the BMC")
    pid = store.get(config, started["id"]).runner_pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"provisiond.jobs" in argv and not any(SECRET.encode() in arg for arg in argv)
    assert SECRET not in readable_by_others(config)
    assert stat.S_IMODE(store.secret_path(config, started["id"]).stat().st_mode) == 0o600
    bmc.task_polls_running = 0
    done = jobs.wait(config, started["id"], 60)
    assert done["state"] == "finished", store.log_path(config, started["id"]).read_text()
    assert bmc.image_uri == URL and done["params"]["image"] == SHOWN
    assert not store.secret_path(config, started["id"]).exists()
    assert SECRET not in readable_by_others(config)


@pytest.mark.parametrize("stage, said", [
    ({"refuse_update": "The value {uri} for the property ImageURI is not valid."},
     f"The value {SHOWN} for the property ImageURI is not valid"),
    ({"task_end": "derived/task_exception.json",
      "task_message": "Cannot download {uri}: 401"},
     f"task Exception: Cannot download {SHOWN}: 401"),
    ({"task_message": "Flashed {uri}"}, f"task 42 Completed: Flashed {SHOWN}"),
])
def test_a_bmc_quoting_the_url_shows_no_password(redfish_node, config, stage, said):
    """A BMC's refusal, its failed task, its success: each may quote the URL it was given;
    the one-line detail, the job's message, its events and the CLI's output must not."""
    cli, bmc = redfish_node
    for name, value in stage.items():
        setattr(bmc, name, value)
    bmc.task_polls_running = 0
    result = cli("firmware", "update", "r1", "--image", URL, "--json")
    assert bmc.image_uri == URL
    job = store.read(config, 1)
    assert said in job.results[0].detail, job.results[0].detail
    seen = [result.out, result.err, job.model_dump_json(),
            [e.data for e in events.read_since(config, 0, kinds=frozenset({"job."}))]]
    assert SECRET not in repr(seen)


@pytest.mark.parametrize("url", [
    f"ftp://fw:{SECRET}@127.0.0.1/b.bin", f"http://fw:{SECRET}@127.0.0.1/a b.bin",
    f"fw:{SECRET}@127.0.0.1/b.bin",
])
def test_a_refused_url_is_one_line_without_its_password(nodes, config, url):
    with pytest.raises(InvalidInput) as caught:
        jobs.start(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": url}, "token:t")
    assert "not an http(s) URL" in str(caught.value) and SECRET not in str(caught.value)
    result = nodes("firmware", "update", "n1", "--image", url)
    assert result.code == 2 and result.err.count("\n") == 1 and SECRET not in result.err
    assert store.job_ids(config) == []


def test_a_runner_without_the_credentials_fails_the_job_in_one_line(nodes, config):
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "cli:test")
    store.secret_path(config, job.id).unlink()  # by hand
    assert runner.run(config, job.id) == 0
    ended = store.read(config, job.id)
    assert ended.state is JobState.FAILED
    assert ended.message == (f"job 1: the credentials of its image cannot be read from "
                             f"{store.secret_path(config, 1)}: No such file or directory")
    assert "n1" not in fake_bmcs(config)  # no BMC got the URL without them


def test_a_job_whose_runner_never_came_is_failed_and_its_credentials_removed(
        nodes, config, monkeypatch):
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "token:t")
    monkeypatch.setattr(store, "SPAWN_GRACE", 0.0)
    store.reap(config)
    assert store.read(config, job.id).state is JobState.FAILED
    assert not store.secret_path(config, job.id).exists()


def old_record(config, job_id: int, state: JobState, mtime: int, url: str = URL,
               **fields) -> Path:
    """A firmware job's record as an older release wrote it: the URL whole, 0644."""
    job = Job(id=job_id, kind=JobKind.FIRMWARE_UPDATE, target="n1", names=["n1"],
              params={"image": url, "timeout": 1800.0}, actor="cli:old", state=state,
              created=mtime, **fields)
    path = store.job_path(config, job_id)
    write_atomic(path, job.model_dump_json(exclude={"secret_params"}))
    os.utime(path, (mtime, mtime))
    return path


def test_records_an_older_release_wrote_with_the_password_lose_it(nodes, config):
    ended = old_record(config, 1, JobState.FINISHED, 1_000_000, finished=1_000_001)
    me = os.getpid()  # stands for the running job's runner
    running = old_record(config, 2, JobState.RUNNING, 1_000_002, runner_pid=me,
                         runner_start=store.process_start(me))
    write_atomic(Layout.of(config).jobs_index,
                 json.dumps({"next_id": 3, "active": {"2": ["node/n1"]}}))
    assert nodes("power", "on", "n3").code == 0  # the first writer after the upgrade
    assert SECRET not in ended.read_text() and ended.stat().st_mtime == 1_000_000
    assert store.read(config, 1).params == {"image": SHOWN, "timeout": 1800.0}
    assert SECRET in running.read_text()  # its runner reads it whole
    assert jobs.get(config, 2)["params"]["image"] == SHOWN  # never shown
    job = store.read(config, 2)
    job.state = JobState.FINISHED
    store.finish(config, job)  # as its runner ends it, the URL whole
    assert SECRET not in readable_by_others(config)
    assert store._read_index(config).no_legacy_secrets


def test_a_long_refusal_cut_to_one_line_shows_no_part_of_the_password(redfish_node, config):
    """The driver cuts a BMC's message to 300 characters: a cut inside the URL must not
    leave the start of its password, which no longer matches the whole one."""
    cli, bmc = redfish_node
    long_secret = "k" + "0123456789abcdef" * 16  # a token as a password
    url = f"http://fw:{long_secret}@127.0.0.1/bios.bin"
    bmc.refuse_update = "The value {uri} for the property ImageURI is not valid."
    result = cli("firmware", "update", "r1", "--image", url, "--json")
    assert bmc.image_uri == url
    detail = store.read(config, 1).results[0].detail
    assert f"The value {SHOWN} for the property" in detail, detail
    assert long_secret[:12] not in detail and long_secret[:12] not in result.out, detail


def test_a_secret_whose_record_went_is_removed_by_the_next_writer(nodes, config):
    """An active job's record deleted by hand (or lost): its claims are freed, and its
    credentials must not stay behind for ever (no record lists them any more)."""
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "cli:test")
    store.job_path(config, job.id).unlink()
    store.create(config, JobKind.POWER, ["n2"], {"action": "on"}, "cli:test")
    assert not store.secret_path(config, job.id).exists()


def test_a_job_whose_index_cannot_be_written_leaves_no_record_nor_secret(
        nodes, config, monkeypatch):
    """A full disk as the index is written: the job is refused whole, not left pending for
    ever (no runner is started, no reaper sees it) with its credentials on disk."""
    write_index = store._write_index

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_write_index", full)
    with pytest.raises(OSError):
        store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "cli:test")
    assert list(Layout.of(config).jobs.glob("1.*")) == []
    monkeypatch.setattr(store, "_write_index", write_index)
    again = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "cli:test")
    assert again.id == 1 and store.secret_path(config, 1).exists()


SIGNED = "X-Amz-Signature=9f8e7d6c5b4a39281706&X-Amz-Expires=3600"
PRESIGNED = f"http://127.0.0.1/bios.bin?{SIGNED}"


def test_a_presigned_urls_query_is_kept_apart_as_a_password_is(nodes, config):
    """A pre-signed URL's query lets whoever holds it fetch the image (S3's signature, a
    SAS token): it is a credential, kept out of the record as a password is."""
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": PRESIGNED},
                       "token:t")
    assert (job.params["image"], job.secret_params) == (f"{SHOWN}?***", ["image"])
    assert "9f8e7d6c5b4a" not in readable_by_others(config)
    assert runner.run(config, job.id) == 0
    assert fake_bmcs(config)["n1"]["last_image"] == PRESIGNED


def test_a_bmc_quoting_a_presigned_url_shows_no_signature(redfish_node, config):
    cli, bmc = redfish_node
    bmc.refuse_update = "The value {uri} for the property ImageURI is not valid."
    result = cli("firmware", "update", "r1", "--image", PRESIGNED, "--json")
    assert bmc.image_uri == PRESIGNED
    detail = store.read(config, 1).results[0].detail
    assert f"The value {SHOWN}?*** for the property" in detail, detail
    assert "9f8e7d6c5b4a" not in result.out + result.err + store.job_path(config, 1).read_text()


def test_an_older_records_presigned_query_is_taken_out_too(nodes, config):
    ended = old_record(config, 1, JobState.FINISHED, 1_000_000, url=PRESIGNED,
                       finished=1_000_001)
    assert nodes("power", "on", "n3").code == 0
    assert "9f8e7d6c5b4a" not in ended.read_text()
    assert store.read(config, 1).params["image"] == f"{SHOWN}?***"


def test_a_record_with_its_query_hidden_is_no_old_record_to_rewrite(nodes, config):
    """`?***` is what a record keeps: not a query to take out again at every look (an
    active job's would hold the one-time rewrite of the old records open)."""
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": PRESIGNED},
                       "token:t")
    index = Layout.of(config).jobs_index  # as an older release left it: no flag
    write_atomic(index, json.dumps({"next_id": 2, "active": {"1": ["node/n1"]}}))
    record = store.job_path(config, job.id).stat()
    assert store._read_index(config).no_legacy_secrets
    assert store.job_path(config, job.id).stat().st_ino == record.st_ino  # not rewritten


def test_a_live_jobs_secret_stays_when_the_index_forgot_it(nodes, config):
    """The sweep of stray secrets asks the record, not only the index: an index lost (deleted
    by hand) must not take the credentials of a job whose runner is yet to read them."""
    job = store.create(config, JobKind.FIRMWARE_UPDATE, ["n1"], {"image": URL}, "token:t")
    Layout.of(config).jobs_index.unlink()
    store.create(config, JobKind.POWER, ["n2"], {"action": "on"}, "token:t")
    assert runner.run(config, job.id) == 0
    assert fake_bmcs(config)["n1"]["last_image"] == URL


def test_a_libraries_log_line_quoting_the_url_shows_no_password(redfish_node, config):
    """sushy logs a BMC's server-side error (a warning, before it retries) with the BMC's
    message, which may quote the ImageURI: the runner's log is 0644, as its records are."""
    cli, bmc = redfish_node
    bmc.refuse_update = "SYS518: cannot fetch {uri} now: try later."
    bmc.refuse_status = 500
    started = jobs.start(config, JobKind.FIRMWARE_UPDATE, ["r1"], {"image": URL, "timeout": 60},
                         "token:op")
    done = jobs.wait(config, started["id"], 60)
    logged = store.log_path(config, started["id"]).read_text()
    assert done["state"] == "failed" and "Got server side error" in logged, logged
    assert f"cannot fetch {SHOWN} now" in logged and SECRET not in logged, logged
    assert SECRET not in readable_by_others(config)


@pytest.mark.parametrize("url", [
    "http://fw:pw/S3cret@127.0.0.1/b.bin", "http://fw:pw?S3cret@127.0.0.1/b.bin",
    "http://fw:pw#S3cret@127.0.0.1/b.bin",
])
def test_a_password_left_unencoded_is_refused_not_stored(nodes, config, url):
    """'/', '?' or '#' end a URL's authority: unencoded in a password, the URL seems to hold
    none (its host 'fw', its port 'pw') and was stored whole in the 0644 record."""
    result = nodes("firmware", "update", "n1", "--image", url)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "percent-encoded" in result.err and "pw" not in result.err
    assert store.job_ids(config) == []


@pytest.mark.parametrize("url", ["https://fw:pw@[fd00::1]:8443/b.bin", "http://127.0.0.1:/b",
                                 "https://[fd00::1]/b.bin", "http://h:8080/a@b/c.bin"])
def test_urls_with_a_port_or_none_pass_the_check(url):
    check_firmware_url(url)  # raises nothing
