"""The model server behind `serve.py`: OpenAI-compatible HTTP API, continuous batching, chat page.

Reading order:
    engine.py         one thread owns the model; admit -> decode -> retire, every step
    batch.py          the running batch: rows joining and leaving one left-padded KV cache
    text_stream.py    token ids -> text deltas (whole characters only, stop strings)
    completion.py     one request as seen from the event loop: engine events -> text pieces
    schema.py         what a request may contain; every violation is a 400 with a reason
    app.py            the routes, OpenAI's response and error shapes, server-sent events
    static/chat.html  the chat page: plain HTML/CSS/JS, no build step, no CDN
"""
