"""A worker that prints a Hugging Face token and a URL password, 20 times each, then fails under torch's @record
(its error file holds them too). With --no-secret it only fails."""
import sys

from torch.distributed.elastic.multiprocessing.errors import record

TOKEN = "hf_" + "Q7" * 15
URL = "https://trainer:pw-" + "z9" * 8 + "@data.example/set"


@record
def main():
    if "--no-secret" in sys.argv:
        raise RuntimeError("failed")
    for i in range(20):
        print(f"step {i}: pulling with {TOKEN} from {URL}", flush=True)
    print(f"about to fail: {TOKEN} {URL}", file=sys.stderr, flush=True)
    raise RuntimeError(f"failed with {TOKEN} while reading {URL}")


main()
