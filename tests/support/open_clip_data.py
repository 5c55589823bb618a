"""open_clip's WebDataset reading, for tests/unit/io/test_open_clip.py: `open_clip_train.data` itself where it
imports, else a copy of its functions; SOURCE says which.

The copy is of open_clip_torch 3.3.0 (PyPI), open_clip_train/data.py: expand_urls, get_dataset_size,
filter_no_caption_or_no_image, log_and_continue, group_by_keys_nothrow and tarfile_to_samples_nothrow, unchanged
but for the one spot marked `webdataset 1.x`. Why a copy: that module imports torchvision, which does not import
beside this repo's torch. open_clip pins webdataset<=0.2.86; this repo has webdataset 1.0.2, and the pipeline
below uses its API (the same calls open_clip makes). The one difference that matters: 1.x's tar_file_expander
ends each tar with an empty dict, on which open_clip's group_by_keys_nothrow fails (KeyError 'fname');
`eof_value=None` turns it off, as 0.2.86 behaves. So tarfile_to_samples_nothrow is this copy's in either case.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import json
import logging
import os

import braceexpand
import webdataset as wds
from webdataset.tariterators import base_plus_ext, tar_file_expander, url_opener, valid_sample

try:  # the real module, where open_clip_torch and a working torchvision are installed
    from open_clip_train.data import (
        filter_no_caption_or_no_image,
        get_dataset_size,
        group_by_keys_nothrow,
        log_and_continue,
    )

    SOURCE = f"open_clip_train.data of open_clip_torch {importlib.metadata.version('open_clip_torch')}"
except Exception as exc:  # not installed, or torchvision fails to import (not only ImportError: RuntimeError too)
    SOURCE = f"copy of open_clip_torch 3.3.0 open_clip_train/data.py (open_clip_train.data: {type(exc).__name__})"

    def expand_urls(urls, weights=None):
        if weights is None:
            expanded_urls = wds.shardlists.expand_urls(urls)
            return expanded_urls, None
        if isinstance(urls, str):
            urllist = urls.split("::")
            weights = weights.split('::')
            assert len(weights) == len(urllist),\
                f"Expected the number of data components ({len(urllist)}) and weights({len(weights)}) to match."
            weights = [float(weight) for weight in weights]
            all_urls, all_weights = [], []
            for url, weight in zip(urllist, weights):
                expanded_url = list(braceexpand.braceexpand(url))
                expanded_weights = [weight for _ in expanded_url]
                all_urls.extend(expanded_url)
                all_weights.extend(expanded_weights)
            return all_urls, all_weights
        else:
            all_urls = list(urls)
            return all_urls, weights

    def get_dataset_size(shards):
        shards_list, _ = expand_urls(shards)
        dir_path = os.path.dirname(shards_list[0])
        sizes_filename = os.path.join(dir_path, 'sizes.json')
        len_filename = os.path.join(dir_path, '__len__')
        if os.path.exists(sizes_filename):
            sizes = json.load(open(sizes_filename, 'r'))
            total_size = sum([int(sizes[os.path.basename(shard)]) for shard in shards_list])
        elif os.path.exists(len_filename):
            # FIXME this used to be eval(open(...)) but that seemed rather unsafe
            total_size = ast.literal_eval(open(len_filename, 'r').read())
        else:
            total_size = None  # num samples undefined
        num_shards = len(shards_list)
        return total_size, num_shards

    def filter_no_caption_or_no_image(sample):
        has_caption = ('txt' in sample)
        has_image = ('png' in sample or 'jpg' in sample or 'jpeg' in sample or 'webp' in sample)
        return has_caption and has_image

    def log_and_continue(exn):
        """Call in an exception handler to ignore any exception, issue a warning, and continue."""
        logging.warning(f'Handling webdataset error ({repr(exn)}). Ignoring.')
        return True

    def group_by_keys_nothrow(data, keys=base_plus_ext, lcase=True, suffixes=None, handler=None):
        """Return function over iterator that groups key, value pairs into samples.

        :param keys: function that splits the key into key and extension (base_plus_ext)
        :param lcase: convert suffixes to lower case (Default value = True)
        """
        current_sample = None
        for filesample in data:
            assert isinstance(filesample, dict)
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()
            # FIXME webdataset version throws if suffix in current_sample, but we have a potential for
            #  this happening in the current LAION400m dataset if a tar ends with same prefix as the next
            #  begins, rare, but can happen since prefix aren't unique across tar files in that dataset
            if current_sample is None or prefix != current_sample["__key__"] or suffix in current_sample:
                if valid_sample(current_sample):
                    yield current_sample
                current_sample = dict(__key__=prefix, __url__=filesample["__url__"])
            if suffixes is None or suffix in suffixes:
                current_sample[suffix] = value
        if valid_sample(current_sample):
            yield current_sample

# webdataset 1.x: no end-of-tar marker, which open_clip's grouping does not expect (0.2.86 has no such parameter)
_NO_EOF = {"eof_value": None} if "eof_value" in inspect.signature(tar_file_expander).parameters else {}


def tarfile_to_samples_nothrow(src, handler=log_and_continue):
    # NOTE this is a re-impl of the webdataset impl with group_by_keys that doesn't throw
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(streams, handler=handler, **_NO_EOF)  # webdataset 1.x: **_NO_EOF added
    samples = group_by_keys_nothrow(files, handler=handler)
    return samples


def train_samples(shards: str, seen: list | None = None) -> wds.DataPipeline:
    """(image, text) pairs as open_clip's get_wds_dataset makes them for training (not resampled), in shard order:
    its shard-order and sample shuffles, node and worker splits, preprocessing/tokenizing and batching left out.
    seen: if given, each sample's key is appended to it on the way (a pass-through stage before to_tuple)."""
    stages = [
        wds.SimpleShardList(shards),
        tarfile_to_samples_nothrow,
        wds.select(filter_no_caption_or_no_image),
        wds.decode("pilrgb", handler=log_and_continue),
        wds.rename(image="jpg;png;jpeg;webp", text="txt"),
    ]
    if seen is not None:
        stages.append(wds.map(lambda sample: seen.append(sample["__key__"]) or sample))
    return wds.DataPipeline(*stages, wds.to_tuple("image", "text"))
