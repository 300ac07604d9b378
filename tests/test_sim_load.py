"""Issue 24, item 5: the twin's engines' ``/metrics`` follow load. Requests beyond ``--max-num-seqs``
wait first come first served, a bigger batch decodes each request slower but the engine faster,
long contexts fill the KV cache and preempt the last scheduled request (vLLM V1's recompute), and
the queue time, the waiting gauge and ``num_preemptions_total`` show it. Driven through the public
API (:func:`~sparkconsole.sim.vllm_metrics.chat_started` and ``render``) in sim time, and through
``curl`` for the client's side; the page is read with the console's own parser."""

from __future__ import annotations

import asyncio
import json

from sparkconsole.serving.metrics import parse_metrics
from sparkconsole.sim import Shell, vllm_logs
from sparkconsole.sim import vllm_metrics as vm
from sparkconsole.sim.scenarios import GLM, _service
from tests.test_sim_metrics import GLM_ARGS, chat_cmd, quiet_engine
from tests.test_sim_model import cluster, settle
from tests.test_sim_shell import HEAD

EPOCH0 = 1.76e9


def scrape(run, t: float):
    (em,) = parse_metrics(vm.render(run, t, EPOCH0))
    return em


def test_long_contexts_fill_the_kv_cache_queue_and_preempt():
    _c, ct = quiet_engine()
    run = ct.engine
    bs = run.kv_block_size
    blocks = run.kv_cache_tokens // bs
    prompt, completion = 120_000, 4_000  # near GLM's max_model_len (131072)
    assert prompt + completion <= run.max_model_len
    fit = blocks // (prompt // bs)  # how many such prompts the KV cache admits at once
    # what is left after them is less than their outputs need: the batch runs out of blocks
    assert (blocks - fit * (prompt // bs)) * bs < fit * completion
    n = fit + 2
    reqs = [vm.chat_started(run, 0.01 * i, prompt, completion) for i in range(n)]
    # the KV cache admits ``fit`` of them; the rest wait, first come first served
    assert [r.sched is not None and r.sched < 1.0 for r in reqs] == [True] * fit + [False] * 2
    mid = scrape(run, 50.0)  # all prefilling
    assert (mid.requests_running, mid.requests_waiting) == (fit, 2)
    assert mid.kv_cache_usage > 0.95
    assert mid.preemptions == 0
    # decoding fills the rest of the cache; then the last scheduled is preempted (recompute)
    victims = [r for r in reqs if r.preempts]
    assert victims and victims[0] is reqs[fit - 1]
    tp = victims[0].preempts[0]
    before, after = scrape(run, tp - 1.0), scrape(run, tp + 1.0)
    assert before.kv_cache_usage > 0.99 and (before.requests_running, before.requests_waiting) == (fit, 2)
    assert before.preemptions == 0
    assert after.preemptions == 1 and (after.requests_running, after.requests_waiting) == (fit - 1, 3)
    assert after.kv_cache_usage < before.kv_cache_usage
    # it goes back to the front of the queue: scheduled again before the two that never ran
    resumed = next(s[0] for s in victims[0].segs if s[1] == "p" and s[0] > tp)
    assert resumed <= min(r.sched for r in reqs[fit:])
    # nothing is lost: every token counted once, every request a success, the queue time observed
    end = max(r.end for r in reqs)
    done = scrape(run, end + 1.0)
    assert (done.requests_running, done.requests_waiting, done.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert done.prompt_tokens == n * prompt and done.generation_tokens == n * completion
    assert done.preemptions == sum(len(r.preempts) for r in reqs) >= 1
    assert done.queue_time.count == n
    assert done.queue_time.sum == sum(r.sched - r.t0 for r in reqs) > 0
    # the queued ones waited for the first batch to finish (no bucket below 200 s holds them)
    le = dict(done.queue_time.buckets)
    assert le[0.3] == fit and le[120.0] == fit and le[float("inf")] == n
    assert done.e2e.count == n and done.ttft.count == n


def test_a_bigger_batch_decodes_each_request_slower_and_the_engine_faster():
    tput, itl = [], []
    for conc in (1, 4, 8):
        _c, ct = quiet_engine()
        run = ct.engine
        reqs = [vm.chat_started(run, 0.0, 100, 256) for _ in range(conc)]
        end = max(r.end for r in reqs)
        em = scrape(run, end + 0.1)
        assert em.generation_tokens == conc * 256
        tput.append(conc * 256 / (end - 0.0))
        itl.append(em.itl.sum / em.itl.count)
    assert tput[0] < tput[1] < tput[2]
    assert itl[0] < itl[1] < itl[2]
    rate1 = vllm_logs.decode_rate(ct.engine)
    assert abs(itl[0] - 1 / rate1) < 1e-9  # alone: the model's own decode rate
    assert abs(itl[2] - (1 + vm.BATCH_SLOWDOWN * 7) / rate1) < 1e-6  # 8 in the batch from start to end


def test_a_request_alone_ends_when_chat_seconds_says():
    _c, ct = quiet_engine()
    run = ct.engine
    r = vm.chat_started(run, 3.0, 40, 100)
    want = vllm_logs.FIRST_TOKEN_S + 40 / vllm_logs.PREFILL_TOK_S + 100 / vllm_logs.decode_rate(run)
    assert abs(r.end - 3.0 - want) < 1e-9
    assert r.sched == 3.0 and not r.preempts
    em = scrape(run, 3.5)
    assert (em.requests_running, em.requests_waiting) == (1.0, 0.0)


async def test_max_num_seqs_queues_curl_requests_and_each_answers_when_its_request_ends():
    c = cluster("healthy")
    ct = _service(c, HEAD, "vllm-glm", GLM, [*GLM_ARGS, "--port", "8000", "--max-num-seqs", "2"], -3_000.0,
                  activity=0.0)
    run = ct.engine
    assert run.max_num_seqs == 2
    tasks = [asyncio.ensure_future(Shell(c, HEAD).capture(chat_cmd("glm-4.7-flash", f"Say hello {i}")))
             for i in range(4)]
    for t in tasks:
        await settle(t)
    c.clock.advance(0.5)
    for t in tasks:
        await settle(t)
    em = scrape(run, c.now())
    assert (em.requests_running, em.requests_waiting) == (2.0, 2.0)
    reqs = list(run.metrics.flight)
    assert len(reqs) == 4
    done_at: dict[int, float] = {}
    while not all(t.done() for t in tasks):
        c.clock.advance(0.05)
        for i, t in enumerate(tasks):
            await settle(t)
            if t.done() and i not in done_at:
                done_at[i] = c.now()
    outs = [t.result() for t in tasks]
    assert all(rc == 0 for _o, _e, rc in outs)
    usages = [json.loads(o)["usage"] for o, _e, _rc in outs]
    assert all(u["completion_tokens"] > 0 for u in usages)
    # each curl got its answer when its request ended (to the clock's step), the queued ones later
    by_end = sorted(reqs, key=lambda r: r.end)
    for r in reqs:
        assert any(abs(at - r.end) <= 0.05 + 1e-6 for at in done_at.values()), r.end
    assert min(r.sched for r in by_end[2:]) >= min(r.end for r in by_end[:2]) - 1e-9
    em = scrape(run, c.now())
    assert em.queue_time.count == 4 and em.queue_time.sum > 0
    assert (em.requests_running, em.requests_waiting) == (0.0, 0.0)


def test_an_abort_while_queued_frees_the_queue_and_counts_as_abort():
    _c, ct = quiet_engine()
    run = ct.engine
    run.max_num_seqs = 1
    run.metrics = None
    a = vm.chat_started(run, 0.0, 50, 200)
    b = vm.chat_started(run, 0.0, 50, 200)
    c = vm.chat_started(run, 0.0, 50, 200)
    assert b.sched is not None and b.sched >= a.end - 1e-9
    c_end = c.end
    vm.chat_aborted(run, b, 1.0)  # b gives up while waiting: c moves up
    assert c.end < c_end
    em = scrape(run, c.end + 1.0)
    assert em.requests_running == 0.0
    page = vm.render(run, c.end + 1.0, EPOCH0)
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="glm-4.7-flash"} 1.0' in page
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="glm-4.7-flash"} 2.0' in page
