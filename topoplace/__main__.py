from topoplace.cli import main

raise SystemExit(main())
