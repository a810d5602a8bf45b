#!/usr/bin/env bash
NAMES="medusa hydra eagle eagle3 eagle31 peagle dflash" /work/final5/replan.sh
/work/final5/bench.sh 0 0.7 1.0
/work/final5/batch.sh 0.7 0
