from hermetic.cli.main import main

raise SystemExit(main())
