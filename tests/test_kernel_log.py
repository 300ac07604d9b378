"""The kernel-log parsers against real captures (tests/fixtures/kernel, sources in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkconsole.probe import kernel_log as kl

FIX = Path(__file__).parent / "fixtures" / "kernel"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def test_every_fixture_has_its_source_in_the_readme() -> None:
    readme = (FIX / "README.md").read_text()
    names = sorted(p.name for p in FIX.glob("*.txt"))
    assert names, "no captures"
    for name in names:
        row = next((line for line in readme.splitlines() if f"`{name}`" in line), "")
        assert "https://github.com/" in row, name


def test_oom_dmesg_iso_joins_the_constraint_line() -> None:
    (kill,) = kl.parse_oom_kills(fixture("oom-dmesg-iso.txt"))
    assert (kill.pid, kill.process) == (1440763, "perl")
    assert kill.total_vm_bytes == 87033376 * 1024
    assert kill.anon_rss_bytes == 60356340 * 1024
    assert (kill.file_rss_bytes, kill.shmem_rss_bytes) == (0, 0)
    assert kill.constraint == "CONSTRAINT_NONE" and kill.scope == "host"
    assert kill.task_memcg == "/user.slice/user-21417.slice/user@21417.service"
    assert kill.stamp == "2024-04-29T14:55:41,679700+02:00"
    # the reaper's line ("reaped process … now anon-rss:0kB") is not a second kill
    assert "perl (pid 1440763)" in kill.words() and "57.6 GiB" in kill.words()


def test_oom_syslog_names_with_parentheses() -> None:
    kills = kl.parse_oom_kills(fixture("oom-syslog.txt"))
    assert [(k.pid, k.process) for k in kills] == [(15784, "python3"), (15925, "(resolved)")]
    assert kills[1].anon_rss_bytes == 4064 * 1024 and kills[1].file_rss_bytes == 3584 * 1024
    assert kills[0].stamp == "May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01"


def test_oom_journal_and_memcg_and_old_kernel() -> None:
    (bun,) = kl.parse_oom_kills(fixture("oom-journal.txt"))
    assert (bun.pid, bun.process, bun.anon_rss_bytes) == (1722931, "bun", 1595620 * 1024)
    assert bun.stamp == "Feb 25 07:39:19 cmc11"
    memcg = kl.parse_oom_kills(fixture("oom-memcg.txt"))
    assert [(k.pid, k.process, k.scope) for k in memcg] == [(140339, "python3", "cgroup"), (141313, "mount", "cgroup")]
    assert "container's memory limit" in memcg[0].words()
    (old,) = kl.parse_oom_kills(fixture("oom-old-kernel.txt"))
    assert (old.pid, old.process, old.anon_rss_bytes, old.shmem_rss_bytes) == (31158, "influxdb", 30790420 * 1024, None)


def test_xid_pid_unknown_and_known() -> None:
    xids = kl.parse_xids(fixture("xid-dmesg-ctime.txt"))
    assert [x.code for x in xids] == [13, 13, 13, 109]
    assert (xids[0].pid, xids[0].process, xids[0].pci) == (None, None, "0000:cb:00")
    assert xids[0].text.startswith("Graphics SM Warp Exception")
    assert (xids[3].pid, xids[3].process) == (1797828, "pt_main_thread")
    assert xids[3].text.startswith("Ch 00000008, errorString CTX SWITCH TIMEOUT")
    assert xids[3].stamp == "[Fri Aug 30 11:43:14 2024]"
    assert "Xid 109 (context switch timeout) in pt_main_thread (pid 1797828)" in xids[3].words()


def test_xid_journal_pid_without_name_and_no_pid() -> None:
    j = kl.parse_xids(fixture("xid-journal.txt"))
    assert [(x.code, x.pid, x.process) for x in j] == [(45, 1818990, "python3"), (45, 1818992, "python3")]
    assert j[0].text == "Ch 00000001 caused by previous Xid 149"
    (mmu,) = kl.parse_xids(fixture("xid-31-mmu.txt"))  # the GPU identity lines are not Xids
    assert (mmu.code, mmu.pid, mmu.process) == (31, 1115, None)
    assert mmu.meaning == "GPU memory page fault (MMU fault)"
    kmsg = kl.parse_xids(fixture("xid-kmsg.txt"))
    assert [(x.code, x.pid, x.process, x.pci) for x in kmsg] == [
        (149, None, None, "0019:01:00"), (94, 1234, "python3", "0000:9b:00")]
    assert kmsg[0].text.startswith("NETIR Fatal XC0")
    (bus,) = kl.parse_xids(fixture("xid-79.txt"))
    assert (bus.code, bus.text, bus.meaning) == (79, "GPU has fallen off the bus", "GPU has fallen off the bus")


def test_gb10_no_memory_line() -> None:
    lines = kl.parse_no_memory(fixture("nvrm-no-memory-gb10.txt"))
    assert len(lines) == 1 and "NV_ERR_NO_MEMORY" in lines[0] and lines[0].startswith("NVRM:")


def test_record_says_which_source_was_readable() -> None:
    text = f"{kl.SOURCE_MARK} source journalctl\n" + fixture("oom-journal.txt") + fixture("xid-journal.txt")
    rec = kl.parse_kernel_log(text)
    assert rec.readable and rec.source == "journalctl -k"
    assert len(rec.oom_kills) == 1 and len(rec.xids) == 2 and not rec.cut
    none = kl.parse_kernel_log(f"{kl.SOURCE_MARK} source none not in adm or systemd-journal; kernel.dmesg_restrict=1\n")
    assert not none.readable and "dmesg_restrict=1" in none.why_unreadable and none.oom_kills == ()
    dm = kl.parse_kernel_log(f"{kl.SOURCE_MARK} source dmesg\n" + fixture("oom-dmesg-iso.txt"))
    assert dm.source == "dmesg" and dm.oom_kills[0].pid == 1440763


def test_bounded_keeps_the_newest_lines() -> None:
    flood = "junk line\n" * 10_000 + fixture("oom-journal.txt")
    rec = kl.parse_kernel_log(flood, max_bytes=4096, max_lines=100)
    assert rec.cut and len(rec.oom_kills) == 1
    text, cut = kl.bounded("a\nb\nc", max_bytes=100, max_lines=2)
    assert (text, cut) == ("b\nc", True)


@pytest.mark.parametrize("text", ["", "Killed process abc (x) total-vm:1kB", "NVRM: Xid (PCI:zz): x",
                                  "\x1b[31mNVRM: Xid\x00", "Killed process 1 (" + "n" * 500 + ") total-vm:1kB, anon-rss:2kB"])
def test_hostile_text_never_raises(text: str) -> None:
    rec = kl.parse_kernel_log(text)
    assert all(len(k.process) <= kl.NAME_MAX for k in rec.oom_kills)
    assert rec.xids == ()
