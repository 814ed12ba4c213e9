"""A manuscript review: ask every reviewer at once, decide on the first two reviews, skip a slow scan.

    mi over the reviewers with an n-of-m join (join=2): the first two reviews decide, the others are withdrawn
    collect="reviews" keeps each reviewer's output in order (None for the withdrawn ones)
    a similarity scan runs in a named region; the editor cancels it when it takes too long (cancel_region),
    and its on_cancel branch records that it was skipped

Run it with `python examples/review_process.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

import wfsub
from wfsub import effect, mi, par, scope, seq, task

# how long each reviewer takes, and what they think (seconds are short so the example runs quickly)
REVIEWERS = {"ada": (0.05, 4), "brian": (0.40, 2), "chen": (0.10, 5), "dora": (0.60, 3)}


def desk_check(ctx: Mapping[str, Any]) -> dict[str, Any]:
    if not ctx["title"]:
        raise ValueError("a manuscript needs a title")
    return {"desk": "passed"}


async def request_review(ctx: Mapping[str, Any]) -> dict[str, Any]:
    reviewer = ctx["item"]
    seconds, score = REVIEWERS[reviewer]
    await anyio.sleep(seconds)
    return {"reviewer": reviewer, "score": score}


async def similarity_scan(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(30)  # far too slow today
    return {"similarity": 0.02}


def decide(ctx: Mapping[str, Any]) -> dict[str, Any]:
    scores = [review["score"] for review in ctx["reviews"] if review is not None]
    mean = sum(scores) / len(scores)
    return {"mean_score": mean, "decision": "accept" if mean >= 4 else "revise"}


REVIEW = seq(
    task(desk_check),
    par(
        mi(
            effect(request_review, timeout=5.0),
            items=lambda ctx: ctx["reviewers"],
            join=2,
            cancel_remaining=True,
            collect="reviews",
            name="reviews",
        ),
        scope(
            "similarity",
            effect(similarity_scan),
            on_cancel=task(lambda ctx: {"similarity": "skipped"}, name="note_skipped"),
        ),
    ),
    task(decide),
)


async def main() -> None:
    sink = wfsub.MemorySink()
    async with wfsub.Substrate(trace_level="min", sinks=[sink]) as sub:
        handle = await sub.new_case(
            REVIEW, {"title": "On tokens and joins", "reviewers": list(REVIEWERS)}, case_id="MS-2041"
        )

        async def editor() -> None:
            await anyio.sleep(0.2)
            status = handle.status()
            print(f"editor at 0.2 s: case is {status.state}, live regions {status.regions}")
            if "similarity" in status.regions:
                print("editor: the similarity scan is too slow; cancelling that region")
                await sub.cancel_region(handle.case_id, "similarity")

        async with anyio.create_task_group() as tg:
            tg.start_soon(editor)
        result = await handle.result(timeout=5)

    print()
    for event in sink.for_case(handle.case_id):
        print(event.format())
    print()
    print("reviews:", [r and f"{r['reviewer']}={r['score']}" for r in result["reviews"]])
    print(f"similarity: {result['similarity']}, mean score {result['mean_score']:.1f} -> {result['decision']}")


if __name__ == "__main__":
    anyio.run(main)
