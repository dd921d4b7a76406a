"""The Ray engine on a local Ray instance writes the same arrays as the local engine."""

from __future__ import annotations

import numpy as np
import pytest

from oodbench import Store
from oodbench.extract.backbones.timm_backbone import load_timm
from oodbench.extract.datasets import image_folder
from oodbench.extract.nac import NacLayer
from oodbench.extract.pipeline import extract

from .helpers import write_images

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_engine_matches_local_engine(tmp_path):
    images = image_folder(write_images(tmp_path / "imgs", {"a": 5, "b": 5}, corrupt=["b/zz.png"]))
    stores = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for engine in ("local", "ray"):
            backbone = load_timm("test_resnet", pretrained=False, image_size=32, nac_layers=[NacLayer("layer4", 5.0)])
            stores[engine] = Store(tmp_path / engine)
            report = extract(
                stores[engine],
                backbone,
                images,
                dataset_id="imgs",
                engine=engine,
                batch_size=3,
                shard_size=4,
                num_workers=0,
                progress=False,
            )
            assert report.num_rows == 10 and len(report.skipped) == 1
    finally:
        ray.shutdown()
    local, remote = stores["local"], stores["ray"]
    meta = local.meta("test_resnet", "imgs")
    assert sorted(meta["arrays"]) == ["extra.nac.layer4", "features", "index", "labels", "logits"]
    for name in meta["arrays"]:
        a = local.read_array("test_resnet", "imgs", name)
        b = remote.read_array("test_resnet", "imgs", name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert remote.meta("test_resnet", "imgs")["skipped"] == meta["skipped"]
    assert np.array_equal(local.read_head("test_resnet").weight, remote.read_head("test_resnet").weight)
