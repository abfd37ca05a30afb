"""Search of our own: BM25 over a passage corpus (wiki-18 or any JSONL in its format).

``index build`` (:mod:`.index`) turns a corpus into an index directory, the ``local`` search
backend (:mod:`searchr1.search.local`) queries it in process, and ``retriever serve``
(:mod:`.server`) serves it on the official Search-R1 ``/retrieve`` API.
"""
