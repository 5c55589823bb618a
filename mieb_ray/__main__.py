from mieb_ray.cli import main

raise SystemExit(main())
