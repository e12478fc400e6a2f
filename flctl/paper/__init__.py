"""The paper's programme and its flow (`flctl paper`, ``flctl.api.paper``): which runs of which spec each table and
figure of the paper shows, with its printed numbers (programme); that programme resolved against sweeps/ and the
run database, with its cost (plan); the flow that plans, launches what is missing and writes the bundle (flow); and
the bundle itself, one browsable folder of every table and figure beside the paper's numbers (bundle)."""
