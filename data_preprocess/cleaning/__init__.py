"""Cleaning a pretraining corpus before it is tokenized (docs/design.md §2.12).

One concept per file, in the order a document meets them:
    text.py           Unicode normalisation and how text is cut into words, lines, paragraphs
    document.py       one document cut once for every rule: numbered words and n-gram ids
    filters.py        Gopher quality and repetition rules (C4's line rules are not built yet)
    decontaminate.py  drop documents sharing a 13-word n-gram with an evaluation item
    minhash.py        MinHash signatures and LSH banding (bands x rows from a Jaccard threshold)
    dedup.py          exact duplicates, and near-duplicate clusters from LSH band buckets
    external_sort.py  sorted runs on disk + a streaming k-way merge: band buckets in bounded RAM
    report.py         clean_report.json / .md: what went in, what came out, and why
    dropped.py        --write_dropped DIR: the dropped documents themselves, one file per rule
The command that runs them is data_preprocess/clean_pretrain_data.py, with its passes in
    file_passes.py    per input file: pass 1 (analyse it) and pass 3 (write its shard), and
                      the state in CLEAN/.clean/ that lets a rerun or another task reuse them
    corpus_dedup.py   pass 2 over the whole corpus: exact copies and near-duplicate clusters,
                      in one process or as the buckets and clusters stages
    array_stages.py   the stages as array tasks (--stage): what each reads and writes
"""
