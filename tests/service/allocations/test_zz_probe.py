from fastapi.testclient import TestClient
import sqlalchemy as sa
from service import schema
from service.allocations import api
from tests.service.helpers import add_nodes
from tests.service.invariant import database_view


def test_probe(client: TestClient) -> None:
    snap = add_nodes(client, ("hgx-h100-mig", "m0"))[0]
    state = client.app.state.service
    print([ (g.index, g.mig_enabled, g.uuid) for g in snap.gpus][:2])
    print([(m.parent_gpu, m.profile, m.uuid) for m in snap.mig_instances][:3])
    mig = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb"})
    print(mig.status_code, mig.json()["tasks"][0]["mig_uuids"] if mig.status_code == 201 else mig.text)
    inst = mig.json()["tasks"][0]["mig_uuids"][0]
    parent = next(m.parent_gpu for m in snap.mig_instances if m.uuid == inst)
    obs = api.observe(state, "job1", "o", {"m0": [parent]}, [], "slurm")
    print(obs)
    with state.engine.connect() as c:
        print(c.execute(sa.select(schema.allocations.c.id, schema.allocations.c.state)).all())
        print(c.execute(sa.select(schema.gpu_holds.c.device, schema.gpu_holds.c.allocation_id)).all())
    print(database_view(state.engine))
