/* A shared object without the lmt entry point: the loader must say so. */
int not_an_lmt_plugin(void);
int not_an_lmt_plugin(void)
{
	return 42;
}
